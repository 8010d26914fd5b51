//! The documentation's commands still work: every `csi-relay` command in a
//! shell block of README.md or docs/ parses with this build's command line
//! (its flags exist, its values are accepted), every path a `kubectl -k`/`-f`
//! or `cargo` command names exists, and README.md gives exactly the two
//! set-up commands, the second of which is what `.ci/run` runs.

use std::path::{Path, PathBuf};

use clap::Parser;
use csi_relay::app::cli::Cli;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The commands of the ```sh blocks of `text`, continuation lines joined.
fn shell_commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_sh = !in_sh && trimmed == "```sh";
            continue;
        }
        if !in_sh || trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                out.push(std::mem::take(&mut pending));
            }
        }
    }
    out
}

/// Splits a command like a shell would for these simple lines: words,
/// with "..." and '...' kept whole and their quotes dropped.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                started = false;
            }
            (None, c) => word.push(c),
        }
    }
    if started || !word.is_empty() {
        out.push(word);
    }
    out
}

/// The argv of the csi-relay invocation in `command`, if it has one:
/// `csi-relay ...`, `kubectl exec ... -- csi-relay ...`, `cargo run ... -- ...`.
fn relay_argv(command: &str) -> Option<Vec<String>> {
    let first = command.split('|').next()?.trim();
    let w = words(first);
    // `helm install csi-relay deploy/`: there csi-relay is a release name.
    if w.first().map(String::as_str) == Some("helm") {
        return None;
    }
    // `kubectl label namespace csi-relay ...`: a namespace's name; kubectl
    // runs the relay only after `--` (`kubectl exec ... -- csi-relay`).
    if w.first().map(String::as_str) == Some("kubectl") && !w.iter().any(|x| x == "--") {
        return None;
    }
    let args: &[String] = if let Some(dash) = w.iter().position(|x| x == "--") {
        let after = &w[dash + 1..];
        match after.first().map(String::as_str) {
            Some("csi-relay") => &after[1..],
            _ if w.first().map(String::as_str) == Some("cargo") => after,
            _ => return None,
        }
    } else {
        let at = w.iter().position(|x| x == "csi-relay")?;
        &w[at + 1..]
    };
    let mut argv = vec!["csi-relay".to_string()];
    argv.extend(args.iter().cloned());
    Some(argv)
}

#[test]
fn every_documented_command_parses_and_names_paths_that_exist() {
    let mut relay = 0;
    let mut failures = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        let name = page
            .strip_prefix(repo())
            .unwrap_or(&page)
            .display()
            .to_string();
        // Commands quoted inline too: `csi-relay ...` (fragments may leave
        // out a required flag; every flag they show must exist).
        for span in text.split('`').skip(1).step_by(2) {
            // A synopsis (`csi-relay serve [FLAGS]`) is no command.
            if span.contains(['[', '<']) {
                continue;
            }
            if let Some(argv) = span
                .strip_prefix("csi-relay ")
                .and_then(|_| relay_argv(span))
            {
                relay += 1;
                match Cli::try_parse_from(&argv) {
                    Ok(_) => {}
                    Err(e) if e.kind() == clap::error::ErrorKind::MissingRequiredArgument => {}
                    Err(e) => failures.push(format!("{name}: `{span}`: {}", e.kind())),
                }
            }
        }
        for command in shell_commands(&text) {
            if let Some(argv) = relay_argv(&command) {
                relay += 1;
                if let Err(e) = Cli::try_parse_from(&argv) {
                    failures.push(format!("{name}: `{command}`: {}", e.kind()));
                }
            }
            let w = words(&command);
            for (i, word) in w.iter().enumerate() {
                let names_path =
                    matches!(word.as_str(), "-k" | "-f" | "--kustomize" | "--filename")
                        && w.first().map(String::as_str) == Some("kubectl");
                // helm install|upgrade|template RELEASE CHART: the chart.
                let names_chart = i == 2
                    && w.first().map(String::as_str) == Some("helm")
                    && matches!(w[1].as_str(), "install" | "upgrade" | "template");
                if !names_path && !names_chart {
                    continue;
                }
                let Some(path) = w.get(i + 1) else { continue };
                if path == "-" || path.contains("://") || path.starts_with('$') {
                    continue;
                }
                if !Path::new(&repo()).join(path).exists() {
                    failures.push(format!(
                        "{name}: `{command}` names {path}, which does not exist"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(relay >= 10, "only {relay} csi-relay commands found");
}

#[test]
fn the_readme_gives_the_two_set_up_commands_and_ci_runs_the_second() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let setup = readme
        .split("## Set-up: the two commands")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a set-up section");
    let commands = shell_commands(setup);
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(
        relay_argv(&commands[0])
            .is_some_and(|argv| argv.get(1).map(String::as_str) == Some("serve")),
        "the first starts the driver: {}",
        commands[0]
    );
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let last = ci
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .expect("a last line");
    assert_eq!(
        last.trim(),
        commands[1],
        ".ci/run ends with the README's test command"
    );
}

#[test]
fn the_readme_stays_short_and_links_each_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    assert!(
        readme.lines().count() < 250,
        "README.md has {} lines",
        readme.lines().count()
    );
    for page in pages().iter().skip(1) {
        let file = page.file_name().unwrap_or_default().to_string_lossy();
        assert!(
            readme.contains(&format!("(docs/{file})")),
            "README.md does not link docs/{file}"
        );
    }
}
