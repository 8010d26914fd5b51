//! Requests counted by the API servers themselves: the audit logs the
//! test environment writes when started with AUDIT=1
//! (`tests/e2e-env/cluster-up.sh`), one JSON line per finished request.
//! `apiserver_request_total` has no label for the caller; the audit log
//! names its user agent.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The host's and the member's audit logs.
pub struct AuditLogs {
    logs: Vec<(&'static str, PathBuf)>,
}

/// Where each log stood (file, length): requests after it are counted.
pub struct Mark(Vec<(u64, u64)>);

impl AuditLogs {
    /// Both clusters' logs, or why there are none.
    pub fn open() -> Result<AuditLogs, String> {
        let home = std::env::var("E2E_HOME").map_err(|_| "no E2E_HOME".to_string())?;
        let logs: Vec<(&'static str, PathBuf)> = ["host", "member"]
            .into_iter()
            .map(|c| {
                (
                    c,
                    PathBuf::from(&home)
                        .join("run")
                        .join(c)
                        .join("logs/audit.log"),
                )
            })
            .collect();
        match logs.iter().find(|(_, p)| !p.is_file()) {
            Some((_, p)) => Err(format!(
                "no {} (start tests/e2e-env with AUDIT=1)",
                p.display()
            )),
            None => Ok(AuditLogs { logs }),
        }
    }

    pub fn mark(&self) -> Mark {
        Mark(
            self.logs
                .iter()
                .map(|(_, p)| std::fs::metadata(p).map_or((0, 0), |m| (m.ino(), m.len())))
                .collect(),
        )
    }

    /// Every event logged since `mark`, with its cluster.
    fn events_since(&self, mark: &Mark) -> Vec<(&'static str, serde_json::Value)> {
        let mut out = Vec::new();
        for ((cluster, path), (file, from)) in self.logs.iter().zip(&mark.0) {
            let now = std::fs::metadata(path).map_or(0, |m| m.ino());
            assert_eq!(
                now,
                *file,
                "{} was rotated since the mark: requests would be missed",
                path.display()
            );
            let mut text = String::new();
            let read = std::fs::File::open(path).and_then(|mut f| {
                f.seek(SeekFrom::Start(*from))?;
                f.read_to_string(&mut text)
            });
            if let Err(e) = read {
                panic!("read {}: {e}", path.display());
            }
            out.extend(
                text.lines()
                    .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                    .map(|event| (*cluster, event)),
            );
        }
        out
    }

    /// Requests since `mark` whose user agent starts with `agent`, by
    /// "cluster verb resource[/subresource]".
    pub fn count_since(&self, mark: &Mark, agent: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (cluster, event) in self.events_since(mark) {
            if !event["userAgent"].as_str().unwrap_or("").starts_with(agent) {
                continue;
            }
            let verb = event["verb"].as_str().unwrap_or("?");
            let object = &event["objectRef"];
            let mut resource = object["resource"].as_str().unwrap_or("-").to_string();
            if let Some(sub) = object["subresource"].as_str() {
                resource = format!("{resource}/{sub}");
            }
            *out.entry(format!("{cluster} {verb} {resource}"))
                .or_default() += 1;
        }
        out
    }
}

/// One write an API server received.
#[derive(Debug)]
pub struct Write {
    pub cluster: &'static str,
    /// "create persistentvolumeclaims x", "update leases y"...
    pub what: String,
    pub received: k8s_openapi::jiff::Timestamp,
    pub code: i64,
}

impl AuditLogs {
    /// The writes (every verb but get, list, watch) received since `mark`
    /// whose user agent contains `agent`.
    pub fn writes_since(&self, mark: &Mark, agent: &str) -> Vec<Write> {
        self.events_since(mark)
            .into_iter()
            .filter(|(_, event)| {
                !matches!(
                    event["verb"].as_str().unwrap_or("?"),
                    "get" | "list" | "watch"
                ) && event["userAgent"].as_str().unwrap_or("").contains(agent)
            })
            .filter_map(|(cluster, event)| {
                let received = event["requestReceivedTimestamp"].as_str()?.parse().ok()?;
                let object = &event["objectRef"];
                Some(Write {
                    cluster,
                    what: format!(
                        "{} {} {}",
                        event["verb"].as_str().unwrap_or("?"),
                        object["resource"].as_str().unwrap_or("-"),
                        object["name"].as_str().unwrap_or("-")
                    ),
                    received,
                    code: event["responseStatus"]["code"].as_i64().unwrap_or(0),
                })
            })
            .collect()
    }
}

/// "host get relayvolumes 1.00, member create persistentvolumeclaims 1.00,
/// ... (total 4.00)": counts divided by `per`.
pub fn per_unit(counts: &BTreeMap<String, u64>, per: usize) -> String {
    let per = per.max(1) as f64;
    let total: u64 = counts.values().sum();
    let parts: Vec<String> = counts
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", *n as f64 / per))
        .collect();
    format!("{} (total {:.2})", parts.join(", "), total as f64 / per)
}
