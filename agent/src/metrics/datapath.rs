//! The packet counters and the lost-event counter, built fresh on every scrape from the
//! kernel's per-CPU counter map (and the agent's own lost-event counts).
//!
//! Reading the map at scrape time means a scrape always shows the kernel's own numbers,
//! including what was counted while no agent ran. Every (hook, reason) pair and every lost-event
//! source is emitted on every scrape, zero or not, so each series exists from the first scrape.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};
use strum::VariantArray as _;

use ipq_common::counters::{counter_index, Action, Counter, Hook, Reason, SAMPLES_LOST_INDEX};
use log::warn;
use prometheus::{
    core::{Collector, Desc},
    proto::MetricFamily,
    IntCounterVec, Opts,
};

use super::LostAt;
use crate::datapath::DatapathError;

/// Reads every counter slot, summed over CPUs, indexed like `counters::counter_index`.
pub(super) type ReadCounters = Box<dyn Fn() -> Result<Vec<Counter>, DatapathError> + Send + Sync>;

/// Events lost in user space, indexed by [`LostAt`]; the kernel's count lives in its map.
pub(super) type LostCounts = Arc<[AtomicU64; <LostAt as strum::EnumCount>::COUNT]>;

/// `source` of the kernel's lost events: conflict samples dropped because the ring was full.
const KERNEL_SOURCE: &str = "kernel";

/// What each action's families say, after "Packets" / "Bytes".
fn action_help(action: Action) -> &'static str {
    match action {
        Action::Dropped => {
            "dropped by the datapath (mode = enforce), by hook (tc_ingress: sent by a workload, \
             tc_egress: sent to a workload, xdp: arriving on an uplink) and reason (fenced, \
             duplicate_source, stale_traffic, quarantined, remote_claim)"
        }
        Action::Observed => {
            "that mode = enforce would have dropped, let through because mode = observe (or \
             on_early_reuse = observe on that address), by hook and reason"
        }
        Action::Reported => {
            "let through and reported as evidence (ARP/NDP from another machine claiming an \
             address held here), by hook and reason"
        }
    }
}

/// `ipq_<action>_packets_total` and `ipq_<action>_bytes_total` for one action.
fn packet_families(action: Action) -> Result<(IntCounterVec, IntCounterVec), prometheus::Error> {
    let what = action.as_ref();
    let help = action_help(action);
    let packets = IntCounterVec::new(
        Opts::new(
            format!("ipq_{what}_packets_total"),
            format!("Packets {help}."),
        ),
        &["hook", "reason"],
    )?;
    let bytes = IntCounterVec::new(
        Opts::new(
            format!("ipq_{what}_bytes_total"),
            format!("Bytes (frame lengths as the hook saw them) {help}."),
        ),
        &["hook", "reason"],
    )?;
    Ok((packets, bytes))
}

fn events_lost() -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(
        Opts::new(
            "ipq_events_lost_total",
            "Conflict events (conflicts and the kernel's conflict samples) lost, by where \
             (kernel: a sample dropped because the sample ring was full; log: a log line \
             suppressed by the log rate limit; api: an event an /v1/events subscriber was too \
             slow to take). Counters and the registry stay exact; only per-event detail is \
             lost.",
        ),
        &["source"],
    )
}

pub(super) struct DatapathCollector {
    read: ReadCounters,
    descs: Vec<Desc>,
    lost: LostCounts,
}

impl DatapathCollector {
    pub(super) fn new(read: ReadCounters, lost: LostCounts) -> Result<Self, prometheus::Error> {
        let mut descs = Vec::new();
        for &action in Action::VARIANTS {
            let (packets, bytes) = packet_families(action)?;
            descs.extend(packets.desc().into_iter().cloned());
            descs.extend(bytes.desc().into_iter().cloned());
        }
        descs.extend(events_lost()?.desc().into_iter().cloned());
        Ok(Self { read, descs, lost })
    }

    fn families(&self) -> Result<Vec<MetricFamily>, prometheus::Error> {
        let values = match (self.read)() {
            Ok(values) if values.len() > SAMPLES_LOST_INDEX as usize => Some(values),
            Ok(values) => {
                warn!(
                    "datapath counters: {} slots read, {} expected; packet counters left out of \
                     this scrape",
                    values.len(),
                    SAMPLES_LOST_INDEX + 1
                );
                None
            }
            Err(e) => {
                warn!("reading the datapath counters for /metrics: {e}");
                None
            }
        };
        let mut out = Vec::new();
        // Without the kernel's numbers the packet families are left out rather than shown as
        // zeros: a counter dropping to zero would read as a reset to rate().
        if let Some(values) = &values {
            for &action in Action::VARIANTS {
                let (packets, bytes) = packet_families(action)?;
                for &hook in Hook::VARIANTS {
                    for &reason in Reason::VARIANTS {
                        let c = values[counter_index(action, hook, reason) as usize];
                        let labels = [hook.as_ref(), reason.as_ref()];
                        packets.with_label_values(&labels).inc_by(c.packets);
                        bytes.with_label_values(&labels).inc_by(c.bytes);
                    }
                }
                out.extend(packets.collect());
                out.extend(bytes.collect());
            }
        }
        // The user-space sources are always known, whatever the kernel map says.
        let lost = events_lost()?;
        if let Some(values) = &values {
            lost.with_label_values(&[KERNEL_SOURCE])
                .inc_by(values[SAMPLES_LOST_INDEX as usize].packets);
        }
        for at in <LostAt as strum::IntoEnumIterator>::iter() {
            lost.with_label_values(&[at.as_ref()])
                .inc_by(self.lost[at as usize].load(Ordering::Relaxed));
        }
        out.extend(lost.collect());
        Ok(out)
    }
}

impl Collector for DatapathCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.families().unwrap_or_else(|e| {
            warn!("building the datapath metric families: {e}");
            Vec::new()
        })
    }
}
