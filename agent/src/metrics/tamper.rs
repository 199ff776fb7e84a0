//! The metrics of what other processes do to ipq's datapath beyond taking an attachment away
//! (that is `ipq_datapath_attachments_lost_total`): writes to its maps, and filters put ahead
//! of its own.

use std::collections::BTreeMap;
use strum::VariantArray as _;

use ipq_common::{counters::Hook, names};
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::{paths::AttachPoint, series::registered};

pub struct TamperMetrics {
    /// Map entries another process changed, found and written back by the verification.
    pub map_entries_rewritten: IntCounterVec,
    /// How long the owner loop took to look again at the last comparison's suspects.
    pub verify_maps_compare_seconds: Gauge,
    /// How long the last comparison of the maps took, off the owner loop.
    pub verify_maps_seconds: Gauge,
    /// 1 while the bpf() watcher reports other processes' calls, 0 where the periodic
    /// verification alone finds them.
    pub bpf_watcher: IntGauge,
    /// 1 for the watcher's mode (`trampolines`, `raw_tracepoint`, `none`), 0 for the others.
    pub bpf_watcher_mode: IntGaugeVec,
    /// Verification passes, by cause (`periodic`, `watcher`) and whether the maps were
    /// compared (`maps`: `compared`, `not_compared`).
    pub verify_passes: IntCounterVec,
    /// Times the watcher stopped reporting after it was attached (its ring reader ended).
    pub bpf_watcher_stops: IntCounter,
    /// Calls the watcher could not report (its ring was full), each answered by verifying
    /// everything.
    pub bpf_watcher_lost_calls: IntCounter,
    /// Hooks where another tool's filter runs before ipq's, by hook.
    pub bypassed_interfaces: IntGaugeVec,
    /// Times a hook was found bypassed; follows the attacher's count.
    pub bypasses: IntCounterVec,
    /// Hooks with another tool's filter or program ahead of ipq's, by hook and verdict.
    pub cotenants_ahead: IntGaugeVec,
}

impl TamperMetrics {
    /// Marks `mode` as the watcher's, and the others not.
    pub fn set_bpf_watcher_mode(&self, mode: ipq_common::watch::WatchMode) {
        use ipq_common::watch::WatchMode;
        for &other in WatchMode::VARIANTS {
            let name: &'static str = other.into();
            self.bpf_watcher_mode
                .with_label_values(&[name])
                .set(i64::from(other == mode));
        }
    }

    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let map_entries_rewritten = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_map_entries_rewritten_total",
                    "Entries of ipq's maps (IPQ_ADDRS, IPQ_SLOTS, IPQ_IFACES slots, IPQ_QBLOOM \
                     words) the verification found different from what ipq wrote (another \
                     process wrote the map) and wrote back, by map.",
                ),
                &["map"],
            )?,
        )?;
        for map in [
            names::MAP_ADDRS,
            names::MAP_SLOTS,
            names::MAP_IFACES,
            names::MAP_QFILTER,
        ] {
            map_entries_rewritten.with_label_values(&[map]).inc_by(0);
        }
        let verify_maps_compare_seconds = registered(
            registry,
            Gauge::new(
                "ipq_datapath_verify_maps_compare_seconds",
                "How long the owner loop took to look again at what the last comparison of \
                 the maps found differing from what ipq wrote (O(differences); the comparison \
                 runs off it).",
            )?,
        )?;
        let verify_maps_seconds = registered(
            registry,
            Gauge::new(
                "ipq_datapath_verify_maps_seconds",
                "How long the last comparison of the maps with what ipq wrote took, their \
                 batched reads included, off the owner loop (O(addresses)).",
            )?,
        )?;
        let bpf_watcher = registered(
            registry,
            IntGauge::new(
                "ipq_datapath_bpf_watcher",
                "1 while the bpf() watcher reports other processes' link detaches, program \
                 attaches and writes to ipq's maps as they happen; 0 where only the periodic \
                 verification finds them (every verify_interval).",
            )?,
        )?;
        let bpf_watcher_mode = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_datapath_bpf_watcher_mode",
                    "1 for the programs that report other processes' bpf() calls: \
                     `trampolines` (fentry on the kernel's bpf() path; other system calls pay \
                     nothing), `raw_tracepoint` (sys_enter; every system call pays), or `none` \
                     (the periodic verification alone); 0 for the others.",
                ),
                &["mode"],
            )?,
        )?;
        let verify_passes = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_verify_passes_total",
                    "Verification passes of ipq's pins, links and maps, by cause: `periodic` \
                     (every verify_interval) or `watcher` (a reported bpf() call of another \
                     process), and by whether the maps were compared in full (`compared`) or \
                     not (`not_compared`: the watcher's trampolines see every write, or the \
                     pass was for links).",
                ),
                &["cause", "maps"],
            )?,
        )?;
        for cause in ["periodic", "watcher"] {
            for maps in ["compared", "not_compared"] {
                verify_passes.with_label_values(&[cause, maps]).inc_by(0);
            }
        }
        let bpf_watcher_stops = registered(
            registry,
            IntCounter::new(
                "ipq_datapath_bpf_watcher_stops_total",
                "Times the bpf() watcher stopped reporting after it was attached (its ring \
                 reader ended); from then until the agent restarts, only the periodic \
                 verification finds other processes' changes.",
            )?,
        )?;
        let bpf_watcher_lost_calls = registered(
            registry,
            IntCounter::new(
                "ipq_datapath_bpf_watcher_lost_calls_total",
                "bpf() calls the watcher could not report because its ring buffer was full \
                 (another process made them faster than the agent read them); each time, the \
                 agent verifies every link and map at once instead of what the calls touched.",
            )?,
        )?;
        let bypassed_interfaces = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_datapath_bypassed_interfaces",
                    "Interfaces whose hook holds ipq's netlink filter with another tool's \
                     filter at a lower priority running first (it can end classification: \
                     what it classifies never reaches ipq), by hook. Counted as unprotected too.",
                ),
                &["hook"],
            )?,
        )?;
        let bypasses = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_bypasses_total",
                    "Times a hook of ipq's was found bypassed by a filter ahead of its own, by \
                     hook.",
                ),
                &["hook"],
            )?,
        )?;
        let cotenants_ahead = registered(
            registry,
            IntGaugeVec::new(
                Opts::new(
                    "ipq_datapath_cotenants_ahead",
                    "Hooks where another tool's filter (netlink) or program (TCX) runs before \
                     ipq's, by hook and by what it does with the interface's addresses' \
                     packets (verdict: hands_on, the hook stays protected; ends_processing, \
                     bypassed; cannot_tell, unverified and not ready).",
                ),
                &["hook", "verdict"],
            )?,
        )?;
        for &hook in Hook::VARIANTS {
            bypassed_interfaces
                .with_label_values(&[hook.as_ref()])
                .set(0);
            bypasses.with_label_values(&[hook.as_ref()]).inc_by(0);
            for verdict in COTENANT_VERDICTS {
                cotenants_ahead
                    .with_label_values(&[hook.as_ref(), verdict])
                    .set(0);
            }
        }
        Ok(Self {
            map_entries_rewritten,
            verify_maps_compare_seconds,
            verify_maps_seconds,
            bpf_watcher,
            bpf_watcher_mode,
            verify_passes,
            bpf_watcher_stops,
            bpf_watcher_lost_calls,
            bypassed_interfaces,
            bypasses,
            cotenants_ahead,
        })
    }

    /// Sets the bypassed gauge from the hooks bypassed now, and carries the attacher's counts
    /// into the counter.
    pub fn observe_bypassed(
        &self,
        points: impl Iterator<Item = AttachPoint>,
        counts: &BTreeMap<AttachPoint, u64>,
    ) {
        let mut now = [0i64; Hook::VARIANTS.len()];
        for point in points {
            now[point.hook() as usize] += 1;
        }
        let mut seen = [0u64; Hook::VARIANTS.len()];
        for (point, n) in counts {
            seen[point.hook() as usize] += n;
        }
        for &hook in Hook::VARIANTS {
            let label = [hook.as_ref()];
            self.bypassed_interfaces
                .with_label_values(&label)
                .set(now[hook as usize]);
            let counter = self.bypasses.with_label_values(&label);
            if seen[hook as usize] > counter.get() {
                counter.inc_by(seen[hook as usize] - counter.get());
            }
        }
    }

    /// Sets the co-tenant gauge from the hooks with something ahead of ipq's now: (attach
    /// point, verdict label).
    pub fn observe_cotenants<'a>(&self, ahead: impl Iterator<Item = (AttachPoint, &'a str)>) {
        let mut now = [[0i64; COTENANT_VERDICTS.len()]; Hook::VARIANTS.len()];
        for (point, verdict) in ahead {
            if let Some(at) = COTENANT_VERDICTS.iter().position(|v| *v == verdict) {
                now[point.hook() as usize][at] += 1;
            }
        }
        for &hook in Hook::VARIANTS {
            for (at, verdict) in COTENANT_VERDICTS.iter().enumerate() {
                self.cotenants_ahead
                    .with_label_values(&[hook.as_ref(), verdict])
                    .set(now[hook as usize][at]);
            }
        }
    }
}

/// The `verdict` labels of `ipq_datapath_cotenants_ahead` (`cotenant::Verdict::label`).
const COTENANT_VERDICTS: [&str; 3] = ["hands_on", "ends_processing", "cannot_tell"];
