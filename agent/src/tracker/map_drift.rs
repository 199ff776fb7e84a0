//! What the verification found written into ipq's maps by another process: compared on the
//! owner loop with what the one writer wrote (the maps were read off it), written back,
//! counted (`ipq_datapath_map_entries_rewritten_total{map}`), published as events, and logged
//! at WARN once per map and pass (never a line per address: a tool rewriting a 64k map would
//! flood the log).

use std::collections::BTreeMap;

use log::warn;

use super::Tracker;
use crate::{
    api::model::EventBody,
    datapath::{verify::Verification, MapDrift},
};

/// Addresses named in a map's WARN line; the rest are counted.
const NAMED: usize = 4;

impl Tracker {
    /// Compares the maps the pass read with what ipq wrote, writes ipq's back where they
    /// differ, and reports it. Returns the differences, for `ipq status`.
    pub(super) fn verify_maps(&mut self, verification: &Verification) -> Vec<MapDrift> {
        let Ok(reading) = &verification.maps else {
            return Vec::new();
        };
        let check = self.enforcer.verify_maps(reading);
        log::debug!(
            "maps verified: {} addresses, read in {:?} off the loop, compared in {:?}",
            check.addresses,
            reading.took,
            check.took
        );
        self.metrics
            .tamper
            .verify_maps_compare_seconds
            .set(check.took.as_secs_f64());
        let at = humantime::format_rfc3339_millis(verification.finished_at).to_string();
        let mut by_map: BTreeMap<&'static str, Vec<&MapDrift>> = BTreeMap::new();
        for drift in &check.drift {
            by_map.entry(drift.map).or_default().push(drift);
            self.metrics
                .tamper
                .map_entries_rewritten
                .with_label_values(&[drift.map])
                .inc();
            self.observer.publish(
                at.clone(),
                EventBody::MapRewritten {
                    map: drift.map.to_owned(),
                    key: drift.key.clone(),
                    found: drift.found.clone(),
                    wanted: drift.wanted.clone(),
                    repaired: drift.error.is_none(),
                    error: drift.error.clone(),
                },
            );
        }
        for (map, drifts) in by_map {
            let failed = drifts.iter().filter(|d| d.error.is_some()).count();
            let named: Vec<String> = drifts
                .iter()
                .take(NAMED)
                .map(|d| format!("{} held {} (ipq wrote {})", d.key, d.found, d.wanted))
                .collect();
            warn!(
                "{map}: {} entries differed from what ipq wrote (another process wrote the map): \
                 {}{}; written back{}",
                drifts.len(),
                named.join("; "),
                if drifts.len() > NAMED { "; ..." } else { "" },
                if failed > 0 {
                    format!(" except {failed} (see ipq events)")
                } else {
                    String::new()
                }
            );
        }
        check.drift
    }
}
