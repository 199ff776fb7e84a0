//! What the verification found written into ipq's maps by another process: the suspects its
//! comparison (off the owner loop) found looked at again here, against what the registry wants
//! (or what was written by hand behind its back), written back, counted
//! (`ipq_datapath_map_entries_rewritten_total{map}`), published as events, and logged at WARN
//! once per map and pass (never a line per address: a tool rewriting a 64k map would flood
//! the log). O(suspects) on the loop.

use std::{
    collections::BTreeMap,
    time::{Instant, SystemTime},
};

use ipq_api::DriftFoundBy;
use ipq_common::addr::AddrKey;
use log::warn;

use super::{effects::Sinks, Tracker};
use crate::{
    api::model::EventBody,
    datapath::{
        bpf_watch::ReportedKey,
        map_check::MapSuspects,
        verify::{drift_lines, Summary, Verification},
        MapDrift,
    },
    metrics::Metrics,
    registry::Registry,
};

/// Addresses named in a map's WARN line; the rest are counted.
const NAMED: usize = 4;

impl Sinks {
    /// Looks again at what the pass found differing from what ipq wrote, writes ipq's back
    /// where the kernel still differs, and reports it. Returns the differences, for `ipq
    /// status`.
    pub(super) fn verify_maps(
        &mut self,
        verification: &Verification,
        registry: &Registry,
        metrics: &Metrics,
    ) -> Vec<MapDrift> {
        let Some(Ok(suspects)) = &verification.maps else {
            return Vec::new();
        };
        metrics
            .tamper
            .verify_maps_seconds
            .set(suspects.took.as_secs_f64());
        let found_by = DriftFoundBy::Comparison;
        self.recheck_suspects(
            suspects,
            verification.finished_at,
            found_by,
            registry,
            metrics,
        )
    }

    /// Looks again at `suspects` against what the registry wants, writes ipq's entries back
    /// where the kernel still differs, and counts, publishes and logs what it found.
    fn recheck_suspects(
        &mut self,
        suspects: &MapSuspects,
        found_at: SystemTime,
        found_by: DriftFoundBy,
        registry: &Registry,
        metrics: &Metrics,
    ) -> Vec<MapDrift> {
        let hand_written = &self.hand_written;
        let wanted = |addr: &AddrKey| hand_written.wanted(registry, addr.to_ip());
        let check = self.enforcer.recheck_maps(suspects, &wanted);
        log::debug!(
            "maps verified: {} addresses compared off the loop in {:?}, {} suspects, looked at \
             again in {:?}",
            check.addresses,
            suspects.took,
            suspects.addrs.len() + suspects.slots.len() + suspects.words.len(),
            check.took
        );
        metrics
            .tamper
            .verify_maps_compare_seconds
            .set(check.took.as_secs_f64());
        let at = humantime::format_rfc3339_millis(found_at).to_string();
        let mut by_map: BTreeMap<ipq_api::CheckedMap, Vec<&MapDrift>> = BTreeMap::new();
        for drift in &check.drift {
            by_map.entry(drift.map).or_default().push(drift);
            metrics
                .tamper
                .map_entries_rewritten
                .with_label_values(&[drift.map.as_ref()])
                .inc();
            self.observer.publish(
                at.clone(),
                EventBody::MapRewritten {
                    map: drift.map,
                    key: drift.key.clone(),
                    found: drift.found.clone(),
                    wanted: drift.wanted.clone(),
                    repaired: drift.error.is_none(),
                    error: drift.error.clone(),
                    found_by: Some(found_by),
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

impl Tracker {
    /// Looks at once at the entries the bpf() watcher saw another process write (their keys,
    /// each read as an address and as an index of `IPQ_SLOTS` and `IPQ_IFACES`: O(keys)),
    /// without waiting for the comparison of the whole maps, which follows.
    pub fn recheck_reported(&mut self, keys: &[ReportedKey]) {
        let started = Instant::now();
        let suspects = self.sinks.enforcer.reported_suspects(keys);
        let found_at = SystemTime::now();
        let drift = self.sinks.recheck_suspects(
            &suspects,
            found_at,
            DriftFoundBy::ReportedWrite,
            &self.core.registry,
            &self.metrics,
        );
        if !drift.is_empty() {
            // `ipq status` shows what was found last, whichever look found it.
            let findings = self.protection.attacher.findings_mut();
            let pins = findings.verified().map_or(0, |v| v.pins);
            findings.set_found(Summary {
                finished_at: found_at,
                took: started.elapsed(),
                pins,
                found: drift_lines(&drift),
            });
        }
    }
}
