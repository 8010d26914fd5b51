//! The suite report: each test that runs alone (the real-cluster suites,
//! the fuzz campaign) appends one JSON line, its name, outcome, seconds and
//! why it was skipped, to the file `RELAY_SUITE_REPORT` names. `.ci/run`
//! sums the lines per suite (`.ci/suite-report.py`): libtest prints no
//! time per test on stable and counts a skipped test as passed.

use std::io::Write;
use std::time::Instant;

pub const ENV: &str = "RELAY_SUITE_REPORT";

/// Times the test on this thread; reports it when dropped.
pub struct Timed {
    test: String,
    started: Instant,
}

impl Timed {
    pub fn start() -> Timed {
        Timed {
            test: std::thread::current()
                .name()
                .unwrap_or("(unnamed test)")
                .to_string(),
            started: Instant::now(),
        }
    }
}

/// One test's line of the report.
pub fn line(test: &str, failed: bool, skipped: Option<&str>, seconds: f64) -> String {
    let outcome = match (failed, skipped) {
        (true, _) => "failed",
        (false, Some(_)) => "skipped",
        (false, None) => "passed",
    };
    serde_json::json!({
        "test": test,
        "outcome": outcome,
        "seconds": (seconds * 10.0).round() / 10.0,
        "why": skipped,
    })
    .to_string()
}

impl Drop for Timed {
    fn drop(&mut self) {
        let Some(path) = std::env::var_os(ENV) else {
            return;
        };
        // A failed assertion unwinds through here: that is the failure.
        let failed = std::thread::panicking();
        let why = super::skipped_because(&self.test);
        let text = line(
            &self.test,
            failed,
            why.as_deref(),
            self.started.elapsed().as_secs_f64(),
        );
        // O_APPEND: one short write per line, whole, whatever else appends.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()));
        if let Err(e) = written {
            let _ = writeln!(
                std::io::stderr(),
                "suite report {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::line;

    #[test]
    fn a_line_names_the_outcome_and_why() {
        let v: serde_json::Value =
            serde_json::from_str(&line("kosmos_e2e::races", false, None, 12.34)).unwrap();
        assert_eq!(v["outcome"], "passed");
        assert_eq!(v["seconds"], 12.3);
        assert!(v["why"].is_null());
        let v: serde_json::Value =
            serde_json::from_str(&line("k8s_e2e::quick", false, Some("no e2e.test"), 0.0)).unwrap();
        assert_eq!(v["outcome"], "skipped");
        assert_eq!(v["why"], "no e2e.test");
        let v: serde_json::Value =
            serde_json::from_str(&line("k8s_e2e::quick", true, Some("x"), 1.0)).unwrap();
        assert_eq!(v["outcome"], "failed");
    }
}
