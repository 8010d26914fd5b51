//! How long the most stalled move of this controller has gone without
//! progress: `csi_relay_move_stalled_seconds`, read at each scrape (a gauge
//! set only when something happens could not grow while nothing does).
//!
//! A move makes progress while its pass reads or sends bytes, or finishes;
//! one whose copy verified waits for the pod's attach and is not stalled,
//! nor is a controller with no move (0). A move that keeps failing (its
//! target claim refused, its movers never start, a member that does not
//! answer) makes none, which is what the alert
//! `CsiRelayMoveStalled` is for.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGauge, Opts};

use crate::rt::unpoisoned::lock;

/// Volume id → when its move last made progress.
fn moves() -> &'static Mutex<HashMap<String, Instant>> {
    static MOVES: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    MOVES.get_or_init(Default::default)
}

/// The move of `volume_id` made progress (or started).
pub fn progressed(volume_id: &str) {
    // Called for every message a pass moves: no allocation once known.
    let now = Instant::now();
    let mut map = lock(moves());
    match map.get_mut(volume_id) {
        Some(at) => *at = now,
        None => {
            map.insert(volume_id.to_string(), now);
        }
    }
}

/// The move of `volume_id` waits on no copy: verified, or over.
pub fn settled(volume_id: &str) {
    lock(moves()).remove(volume_id);
}

/// Seconds since the least recent progress of a move not settled.
pub fn stalled_seconds() -> i64 {
    let now = Instant::now();
    lock(moves())
        .values()
        .map(|at| now.duration_since(*at).as_secs())
        .max()
        .map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX))
}

/// The gauge, set from the moves when the registry is gathered.
pub struct StallCollector {
    gauge: IntGauge,
}

impl StallCollector {
    pub fn new() -> prometheus::Result<Self> {
        Ok(StallCollector {
            gauge: IntGauge::with_opts(Opts::new(
                "move_stalled_seconds",
                "Seconds the most stalled volume move of this controller has gone without \
                 reading, sending or finishing a pass (0: none copying)",
            ))?,
        })
    }
}

impl Collector for StallCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.gauge.set(stalled_seconds());
        self.gauge.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_is_stalled_from_its_last_progress_until_it_settles() {
        let id = "m-east-stall-test";
        progressed(id);
        let collector = StallCollector::new().unwrap();
        // Another test's move may be in the map too: only ours is judged.
        lock(moves()).insert(
            id.into(),
            Instant::now() - std::time::Duration::from_secs(700),
        );
        assert!(stalled_seconds() >= 700);
        let shown = collector.collect()[0].get_metric()[0]
            .get_gauge()
            .get_value();
        assert!(shown >= 700.0, "{shown}");
        settled(id);
        assert!(lock(moves()).get(id).is_none());
    }
}
