//! The crate's architecture, checked: every module (one file) imports only
//! from its own layer or the layers below it (the table in `src/lib.rs`),
//! no modules import each other in a cycle, and each layer's `mod.rs` says
//! what it may import. Run it alone with
//! `cargo test --test suite layering -- --nocapture` (it prints the graph's
//! size; with `LAYERING_EDGES=1`, every import).
//!
//! Within a layer that names its parts (`PARTS`), the same holds between
//! them: each imports only the parts below it, and every file of the layer
//! is one of them.
//!
//! A module's imports are the `crate::`, `super::` and `self::` paths in its
//! code (braced `use` groups expanded, and names a `use` bound to a module
//! followed), resolved to the longest module path that is a file. Code
//! under `#[cfg(test)]` is left out: tests may reach across layers to set
//! things up. So is a `mod.rs`'s re-export of its own children, which is
//! how a folder shows its contents, not a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first: a layer may import itself and the ones before it.
const LAYERS: &[&str] = &[
    "csi", "domain", "rt", "os", "store", "k8s", "backends", "ops", "grpc", "app",
];

/// The parts of a layer, lowest first, where it names them: a part may
/// import itself and the parts before it. Every module of the layer must be
/// named here, so a new file takes its place on purpose.
const PARTS: &[(&str, &[&str])] = &[(
    "store",
    &[
        "error",
        "wal",
        "overlay",
        "group_commit",
        "record",
        "limits",
        "index",
        "tables",
        "journal",
        "api",
    ],
)];

type ModPath = Vec<String>;

struct Module {
    path: ModPath,
    file: PathBuf,
    is_dir_module: bool,
    code: String,
}

#[derive(Default)]
struct Report {
    modules: usize,
    edges: BTreeSet<(String, String)>,
    /// `from -> to (layer a may not import layer b)`.
    violations: Vec<String>,
    cycles: Vec<Vec<String>>,
}

fn name(p: &ModPath) -> String {
    p.join("::")
}

/// Where `p` stands among its layer's `PARTS`: `None` when the layer names
/// none or `p` is the layer itself, `Err` when `p` is not among them.
fn part(p: &ModPath) -> Option<Result<usize, ()>> {
    let (layer, own) = (p.first()?, p.get(1)?);
    let (_, parts) = PARTS.iter().find(|(l, _)| l == layer)?;
    Some(parts.iter().position(|x| x == own).ok_or(()))
}

/// Every module file under `src`, with its production code.
fn modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    walk(src, &mut files);
    files.sort();
    let test_only: BTreeSet<PathBuf> = files.iter().flat_map(|f| test_files(f)).collect();
    files
        .into_iter()
        .filter(|f| !test_only.contains(f))
        .filter_map(|file| {
            let rel = file.strip_prefix(src).ok()?.to_path_buf();
            let first = rel.components().next()?.as_os_str().to_str()?.to_string();
            if first == "bin" || rel == Path::new("main.rs") || rel == Path::new("lib.rs") {
                return None;
            }
            let is_dir_module = rel.file_name()? == "mod.rs";
            let mut path: ModPath = rel
                .parent()?
                .components()
                .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
                .collect();
            if !is_dir_module {
                path.push(rel.file_stem()?.to_str()?.to_string());
            }
            let text = std::fs::read_to_string(&file).ok()?;
            Some(Module {
                path,
                file,
                is_dir_module,
                code: production_code(&text),
            })
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files a module declares under `#[cfg(test)]` (`mod tests;`, with or
/// without `#[path]`).
fn test_files(file: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let own_dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
        dir.to_path_buf()
    } else {
        dir.join(file.file_stem().unwrap_or_default())
    };
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if *line != "#[cfg(test)]" {
            continue;
        }
        let mut path_attr = None;
        for next in lines.iter().skip(i + 1).take(3) {
            if let Some(rest) = next.strip_prefix("#[path = \"") {
                path_attr = rest.strip_suffix("\"]").map(str::to_string);
                continue;
            }
            let decl = next
                .strip_prefix("pub(crate) mod ")
                .or_else(|| next.strip_prefix("pub mod "))
                .or_else(|| next.strip_prefix("mod "));
            if let Some(name) = decl.and_then(|d| d.strip_suffix(';')) {
                out.push(match &path_attr {
                    Some(p) => dir.join(p),
                    None if own_dir.join(format!("{name}.rs")).exists() => {
                        own_dir.join(format!("{name}.rs"))
                    }
                    None => own_dir.join(name).join("mod.rs"),
                });
            }
            break;
        }
    }
    out
}

/// The text without comments, string contents and `#[cfg(test)]` blocks.
fn production_code(text: &str) -> String {
    let plain = strip_comments_and_strings(text);
    let lines: Vec<&str> = plain.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or("");
        if line == "#[cfg(test)]" && next.contains("mod ") && next.ends_with('{') {
            // Skip to the brace that closes the module.
            let mut depth = 0i64;
            i += 1;
            while i < lines.len() {
                depth += lines[i].matches('{').count() as i64;
                depth -= lines[i].matches('}').count() as i64;
                i += 1;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        out.push_str(lines[i]);
        out.push('\n');
        i += 1;
    }
    out
}

/// Comments go; string and char literals keep their quotes but not their
/// contents, so no brace or path inside one is counted.
fn strip_comments_and_strings(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && b.get(i + 1) == Some(&'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == '*' && b[i + 1] == '/') {
                i += 1;
            }
            i += 2;
            continue;
        }
        if c == 'r' && (b.get(i + 1) == Some(&'"') || b.get(i + 1) == Some(&'#')) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) == Some(&'"') && (i == 0 || !is_ident(b[i - 1])) {
                j += 1;
                loop {
                    if j >= b.len() {
                        break;
                    }
                    if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push_str("\"\"");
                i = j;
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                } else if b[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == '\'' {
            // A char literal ('x', '\n', '{'), not a lifetime ('a).
            let close = if b.get(i + 1) == Some(&'\\') {
                (i + 2..(i + 12).min(b.len())).find(|&k| b[k] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = close {
                out.push_str("' '");
                i = end + 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths of a use-tree that starts at `s` (just after `crate::`,
/// `super::` or an alias and its `::`): `a::b`, `a::{b, c::d}`,
/// `a::{self as x}`. Each comes with the name it binds, if any.
fn use_tree(
    s: &[char],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(ModPath, Option<String>)>,
) -> usize {
    let mut path = prefix;
    loop {
        while i < s.len() && s[i].is_whitespace() {
            i += 1;
        }
        if s.get(i) == Some(&'{') {
            i += 1;
            loop {
                while i < s.len() && (s[i].is_whitespace() || s[i] == ',') {
                    i += 1;
                }
                if i >= s.len() || s[i] == '}' {
                    return i + 1;
                }
                i = use_tree(s, i, path.clone(), out);
            }
        }
        if s.get(i) == Some(&'*') {
            out.push((path, None));
            return i + 1;
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        if start == i {
            out.push((path, None));
            return i;
        }
        let seg: String = s[start..i].iter().collect();
        if seg == "self" {
            // `a::{self}` / `a::{self as x}`: the module `a` itself.
            let (alias, j) = alias_after(s, i);
            let bound = alias.or_else(|| path.last().cloned());
            out.push((path, bound));
            return j;
        }
        path.push(seg);
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            i += 2;
            continue;
        }
        let (alias, j) = alias_after(s, i);
        let bound = alias.or_else(|| path.last().cloned());
        out.push((path, bound));
        return j;
    }
}

fn alias_after(s: &[char], i: usize) -> (Option<String>, usize) {
    let mut j = i;
    while j < s.len() && s[j].is_whitespace() {
        j += 1;
    }
    if s.get(j) == Some(&'a')
        && s.get(j + 1) == Some(&'s')
        && s.get(j + 2).is_some_and(|c| c.is_whitespace())
    {
        j += 2;
        while j < s.len() && s[j].is_whitespace() {
            j += 1;
        }
        let start = j;
        while j < s.len() && is_ident(s[j]) {
            j += 1;
        }
        return (Some(s[start..j].iter().collect()), j);
    }
    (None, i)
}

/// Whether `word` starts at `i` as a whole path segment.
fn word_at(s: &[char], i: usize, word: &str) -> bool {
    let w: Vec<char> = word.chars().collect();
    s.len() >= i + w.len()
        && s[i..i + w.len()] == w[..]
        && (i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == ':' || s[i - 1] == '.'))
}

/// A folder's code without the re-exports of its own children
/// (`pub use child::X;`, over one line or several): they show what the
/// folder holds, and are no dependency of its own.
fn without_own_reexports(m: &Module) -> String {
    if !m.is_dir_module {
        return m.code.clone();
    }
    let mut out = String::new();
    let mut skipping = false;
    for line in m.code.lines() {
        let t = line.trim_start();
        if !skipping {
            let reexport = t
                .strip_prefix("pub use ")
                .or_else(|| t.strip_prefix("pub(crate) use "));
            skipping = reexport
                .is_some_and(|rest| !rest.starts_with("crate::") && !rest.starts_with("super::"));
        }
        if skipping {
            skipping = !line.contains(';');
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The absolute paths module `m` refers to.
fn references(m: &Module) -> Vec<ModPath> {
    let code = without_own_reexports(m);
    let s: Vec<char> = code.chars().collect();
    // The module `super` and `self` are relative to.
    let here = m.path.clone();
    let mut found: Vec<(ModPath, Option<String>)> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if word_at(&s, i, "crate::") {
            let j = use_tree(&s, i + 7, Vec::new(), &mut found);
            i = j.max(i + 1);
            continue;
        }
        if word_at(&s, i, "super::") || word_at(&s, i, "self::") {
            let mut base = here.clone();
            let mut j = i;
            if word_at(&s, j, "self::") {
                j += 6;
            }
            while s[j..].starts_with(&['s', 'u', 'p', 'e', 'r', ':', ':']) {
                base.pop();
                j += 7;
            }
            let j2 = use_tree(&s, j, base, &mut found);
            i = j2.max(i + 1);
            continue;
        }
        i += 1;
    }
    // Names bound to modules: by `use`, and the module's own children
    // (`mod x;`), then their uses (`naming::x`, `bind::unstage`).
    let mut out: Vec<ModPath> = found.iter().map(|(p, _)| p.clone()).collect();
    let mut aliases: BTreeMap<String, ModPath> = found
        .into_iter()
        .filter_map(|(p, bound)| bound.map(|b| (b, p)))
        .collect();
    for line in code.lines() {
        let t = line.trim();
        let decl = t
            .strip_prefix("pub(crate) mod ")
            .or_else(|| t.strip_prefix("pub mod "))
            .or_else(|| t.strip_prefix("mod "));
        if let Some(child) = decl.and_then(|d| d.strip_suffix(';')) {
            let mut p = here.clone();
            p.push(child.to_string());
            aliases.insert(child.to_string(), p);
        }
    }
    let mut i = 0;
    while i < s.len() {
        if i > 0 && (is_ident(s[i - 1]) || s[i - 1] == ':' || s[i - 1] == '.') || !is_ident(s[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        let word: String = s[start..i].iter().collect();
        if s.get(i) == Some(&':') && s.get(i + 1) == Some(&':') {
            if let Some(base) = aliases.get(&word) {
                let mut tmp = Vec::new();
                let j = use_tree(&s, i + 2, base.clone(), &mut tmp);
                out.extend(tmp.into_iter().map(|(p, _)| p));
                i = j.max(i + 1);
            }
        }
    }
    out
}

/// The longest prefix of `path` that is a module.
fn resolve(path: &ModPath, known: &BTreeSet<ModPath>) -> Option<ModPath> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| known.contains(p))
}

fn check(src: &Path) -> Report {
    let mods = modules(src);
    let known: BTreeSet<ModPath> = mods.iter().map(|m| m.path.clone()).collect();
    let mut report = Report {
        modules: mods.len(),
        ..Report::default()
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in &mods {
        graph.entry(name(&m.path)).or_default();
        if let Some(Err(())) = part(&m.path) {
            report.violations.push(format!(
                "{} is not among the parts of {} (PARTS in tests/suite/layering.rs) in {}",
                name(&m.path),
                m.path[0],
                m.file.display()
            ));
        }
        for r in references(m) {
            let Some(to) = resolve(&r, &known) else {
                continue;
            };
            if to == m.path {
                continue;
            }
            let (from_n, to_n) = (name(&m.path), name(&to));
            let rank = |p: &ModPath| {
                LAYERS
                    .iter()
                    .position(|l| p.first().is_some_and(|f| f == l))
            };
            match (rank(&m.path), rank(&to)) {
                (Some(a), Some(b)) if b <= a => {}
                (a, b) => {
                    let v = format!(
                        "{from_n} -> {to_n} ({} may not import {}) in {}",
                        a.map_or("an unknown layer", |a| LAYERS[a]),
                        b.map_or("an unknown layer", |b| LAYERS[b]),
                        m.file.display()
                    );
                    if !report.violations.contains(&v) {
                        report.violations.push(v);
                    }
                }
            }
            if let (Some(Ok(a)), Some(Ok(b))) = (part(&m.path), part(&to)) {
                if m.path[0] == to[0] && b > a {
                    let v = format!(
                        "{from_n} -> {to_n} ({} may not import {}, above it in {}) in {}",
                        m.path[1],
                        to[1],
                        m.path[0],
                        m.file.display()
                    );
                    if !report.violations.contains(&v) {
                        report.violations.push(v);
                    }
                }
            }
            graph
                .entry(from_n.clone())
                .or_default()
                .insert(to_n.clone());
            report.edges.insert((from_n, to_n));
        }
    }
    report.cycles = cycles(&graph);
    report.cycles.sort();
    report
}

/// The strongly connected components with more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn imports_point_down_the_layers_and_never_in_a_cycle() {
    let report = check(&src_dir());
    eprintln!(
        "layering: {} modules, {} imports between them",
        report.modules,
        report.edges.len()
    );
    if std::env::var_os("LAYERING_EDGES").is_some() {
        for (from, to) in &report.edges {
            eprintln!("{from} -> {to}");
        }
    }
    assert!(
        report.modules > 80,
        "only {} modules found under src/",
        report.modules
    );
    let src = src_dir();
    for (layer, parts) in PARTS {
        for p in *parts {
            let dir = src.join(layer);
            assert!(
                dir.join(format!("{p}.rs")).exists() || dir.join(p).join("mod.rs").exists(),
                "PARTS names {layer}::{p}, which is no module"
            );
        }
    }
    let cycles: Vec<String> = report.cycles.iter().map(|c| c.join(" <-> ")).collect();
    assert!(
        report.violations.is_empty() && cycles.is_empty(),
        "imports against the layers:\n{}\nmodules that import each other:\n{}",
        report.violations.join("\n"),
        cycles.join("\n")
    );
}

#[test]
fn each_layer_says_what_it_may_import() {
    let src = src_dir();
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for (rank, layer) in LAYERS.iter().enumerate() {
        assert!(
            lib.contains(&format!("| `{layer}` |")),
            "src/lib.rs's table does not name the layer {layer}"
        );
        if *layer == "csi" {
            continue;
        }
        let doc = std::fs::read_to_string(src.join(layer).join("mod.rs")).unwrap();
        let line = doc
            .lines()
            .find_map(|l| l.strip_prefix("//! May import: "))
            .unwrap_or_else(|| panic!("src/{layer}/mod.rs has no \"May import:\" line"));
        let want = if *layer == "app" {
            "every other layer.".to_string()
        } else {
            let below: Vec<String> = LAYERS[..rank].iter().map(|l| format!("`{l}`")).collect();
            format!("{}.", below.join(", "))
        };
        assert_eq!(line, want, "src/{layer}/mod.rs");
    }
}

/// The checker itself finds what it is for, in a made-up tree.
#[test]
fn the_checker_finds_a_cycle_and_an_upward_import() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let put = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(
        "domain/mod.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\nfn f() { c::g() }\n",
    );
    put("domain/c.rs", "use super::f;\n");
    put(
        "domain/a.rs",
        "use super::b::B;\n// crate::app::x in a comment is no import\n",
    );
    put(
        "domain/b.rs",
        "use crate::domain::{a::{self as first}, b};\nfn f() { let s = \"crate::ops::y\"; first::g(); }\n",
    );
    put("ops/mod.rs", "pub mod c;\n");
    put(
        "ops/c.rs",
        "use crate::domain::a;\n#[cfg(test)]\nmod tests {\n    use crate::app::z;\n}\n",
    );
    put("rt/mod.rs", "pub mod d;\n");
    put("rt/d.rs", "fn f() { crate::ops::c::run(); }\n");
    let report = check(src);
    assert_eq!(
        report.cycles,
        vec![
            vec!["domain".to_string(), "domain::c".to_string()],
            vec!["domain::a".to_string(), "domain::b".to_string()],
        ]
    );
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    assert!(
        report.violations[0].starts_with("rt::d -> ops::c (rt may not import ops)"),
        "{:?}",
        report.violations
    );
    assert!(report
        .edges
        .contains(&("ops::c".into(), "domain::a".into())));
    assert!(
        !report.edges.iter().any(|(_, to)| to.starts_with("app")),
        "test code and comments are not imports"
    );
}

/// The checker holds a layer that names its parts to their order.
#[test]
fn the_checker_finds_a_part_importing_one_above_it_and_a_part_not_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let put = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put(
        "store/mod.rs",
        "mod api;\nmod journal;\nmod stray;\nmod tables;\n",
    );
    put("store/api.rs", "use super::journal::Journal;\n");
    put("store/journal.rs", "\n");
    put("store/tables.rs", "fn f() { super::journal::run(); }\n");
    put("store/stray.rs", "\n");
    let report = check(src);
    assert!(report.cycles.is_empty(), "{:?}", report.cycles);
    let mut violations = report.violations.clone();
    violations.sort();
    assert_eq!(violations.len(), 2, "{violations:?}");
    assert!(
        violations[0].starts_with("store::stray is not among the parts of store"),
        "{violations:?}"
    );
    assert!(
        violations[1].starts_with(
            "store::tables -> store::journal (tables may not import journal, above it in store)"
        ),
        "{violations:?}"
    );
    assert!(report
        .edges
        .contains(&("store::api".into(), "store::journal".into())));
}
