//! deploy/monitoring: the alerting rules pass their promtool tests, the
//! PrometheusRule carries the same rules, and every series the rules, their
//! tests and the Grafana dashboard read is one a running relay exports (a
//! real scrape of a member controller with leader election on the real
//! control planes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common;
use crate::e2e_support;

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/monitoring")
        .join(file)
}

fn promtool(args: &[&str]) -> Option<String> {
    let out = Command::new("promtool").args(args).output().ok()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    Some(text)
}

#[test]
fn the_alerting_rules_pass_their_promtool_tests() {
    let rules = monitoring("rules.yaml");
    let tests = monitoring("tests/rules.test.yaml");
    let Some(checked) = promtool(&["check", "rules", &rules.display().to_string()]) else {
        return common::skip(
            "no promtool (Debian's prometheus package has it; .ci/run installs it)",
        );
    };
    assert!(checked.contains("SUCCESS: 10 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", &tests.display().to_string()]).expect("promtool");
    assert!(tested.contains("SUCCESS"), "{tested}");
}

fn yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(monitoring(file)).expect("read");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_prometheusrule_carries_the_rules_file() {
    let plain = yaml("rules.yaml");
    let operator = yaml("prometheusrule.yaml");
    assert_eq!(operator["kind"], "PrometheusRule");
    assert_eq!(
        operator["spec"]["groups"], plain["groups"],
        "prometheusrule.yaml's groups differ from rules.yaml's"
    );
}

/// The csi_relay_* names in `text`, histogram series folded to their family.
fn series_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("csi_relay_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end] == b'_'
                || bytes[end].is_ascii_digit())
        {
            end += 1;
        }
        let name = &text[start..end];
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|f| f.ends_with("_seconds"))
            .unwrap_or(name);
        names.insert(family.to_string());
        i = end;
    }
    names
}

/// What the rules, their tests and the dashboard read.
fn names_read() -> BTreeSet<String> {
    let mut read = BTreeSet::new();
    for file in [
        "rules.yaml",
        "tests/rules.test.yaml",
        "grafana-dashboard.json",
    ] {
        let text = std::fs::read_to_string(monitoring(file)).expect("read");
        read.extend(series_names(&text));
    }
    read
}

#[test]
fn the_dashboard_queries_only_the_relays_series() {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring("grafana-dashboard.json")).unwrap(),
    )
    .expect("dashboard JSON");
    let mut exprs = 0;
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            assert!(
                !series_names(expr).is_empty(),
                "panel {:?} reads no csi_relay series: {expr}",
                panel["title"]
            );
            exprs += 1;
        }
    }
    assert!(exprs >= 8, "{exprs} queries");
}

#[tokio::test]
async fn every_series_the_monitoring_reads_is_in_a_real_scrape() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        return common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let address = format!("127.0.0.1:{port}");
    let d = e2e_support::start_member_relay(
        &env,
        "controller",
        &[
            "--mode",
            "controller",
            "--leader-election",
            "--leader-election-namespace",
            "default",
            "--driver-name",
            "monitoring.e2e.relay.csi.dev",
            "--metrics-address",
            &address,
            "--housekeeping-interval",
            "1",
        ],
    )
    .await;
    let c = d.controller();
    let name = format!("monitoring-{}", std::process::id());
    let vol = e2e_support::create_until_ok(&c, &env, &name, 16 << 20).await;
    e2e_support::delete_until_ok(&c, &vol.volume_id).await;
    // Housekeeping (each second) sets the unfinished-volume gauges.
    let read = names_read();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let exported = loop {
        let names = series_names(&scrape(&address).await.unwrap_or_default());
        if read.is_subset(&names) || std::time::Instant::now() > deadline {
            break names;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let missing: Vec<&String> = read.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "read by deploy/monitoring but not exported: {missing:?} (exported: {exported:?})"
    );
    eprintln!(
        "monitoring: {} series names read by the rules, their tests and the dashboard, all among the {} a real scrape exports",
        read.len(),
        exported.len()
    );
}

/// GET /metrics over plain HTTP/1.0 on loopback.
async fn scrape(address: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(address).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: relay\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(body)
}
