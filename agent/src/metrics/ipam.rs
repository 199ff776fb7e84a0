//! The metrics that keep ipq-ipam's releases honest: held releases put back after their files
//! vanished, and the `network` label bounded. A network name comes from a CNI config (or an
//! API caller), so it becomes a label only when it is a valid name, and only the first
//! [`MAX_NETWORK_LABELS`] distinct ones do: the rest count under `network="other"`, so a
//! caller cannot grow the series without bound.

use std::{
    collections::HashSet,
    sync::{Mutex, PoisonError},
};

use ipq_api::model::cni_names::check_network_name;
use prometheus::{IntCounter, Registry};

use crate::series::registered;

/// Distinct networks that get a `network` label of their own.
pub const MAX_NETWORK_LABELS: usize = 32;
/// The label of every network beyond [`MAX_NETWORK_LABELS`], and of invalid names.
pub const OTHER_NETWORK: &str = "other";

pub struct IpamMetrics {
    /// `ipq_ipam_spool_restored_total`: held releases whose file vanished under the running
    /// agent and that it wrote back from memory.
    pub spool_restored: IntCounter,
    /// `ipq_ipam_network_labels_overflow_total`: release and exhaustion events counted under
    /// `network="other"` (a name over the cap, or not a valid network name).
    pub label_overflow: IntCounter,
    /// `ipq_ipam_allocation_records_full_total`: ipq-ipam ADDs refused because the table of
    /// allocation records was full.
    pub records_full: IntCounter,
    labelled: Mutex<HashSet<String>>,
}

impl IpamMetrics {
    pub(super) fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        Ok(Self {
            spool_restored: registered(
                registry,
                IntCounter::new(
                    "ipq_ipam_spool_restored_total",
                    "Held ipq-ipam releases whose file under state_dir/ipam-releases vanished \
                     while the agent ran (the directory removed or emptied) and that the agent \
                     wrote back from memory.",
                )?,
            )?,
            label_overflow: registered(
                registry,
                IntCounter::new(
                    "ipq_ipam_network_labels_overflow_total",
                    "ipq-ipam release and exhaustion events counted under network=\"other\": \
                     the network name was not a valid one, or more than 32 networks already \
                     had a label.",
                )?,
            )?,
            records_full: registered(
                registry,
                IntCounter::new(
                    "ipq_ipam_allocation_records_full_total",
                    "ipq-ipam ADDs refused (CNI error 11) because the agent already kept as \
                     many allocation records as the registry's capacity; none is evicted.",
                )?,
            )?,
            labelled: Mutex::new(HashSet::new()),
        })
    }

    /// The `network` label of `network` (`""` for none), without counting an overflow (for
    /// gauges set from every scan).
    pub fn network_label(&self, network: Option<&str>) -> String {
        let Some(name) = network.filter(|n| !n.is_empty()) else {
            return String::new();
        };
        if check_network_name(name).is_err() {
            return OTHER_NETWORK.to_owned();
        }
        let mut labelled = self.labelled.lock().unwrap_or_else(PoisonError::into_inner);
        if labelled.contains(name) {
            return name.to_owned();
        }
        if labelled.len() < MAX_NETWORK_LABELS {
            labelled.insert(name.to_owned());
            return name.to_owned();
        }
        OTHER_NETWORK.to_owned()
    }

    /// [`network_label`](Self::network_label) for one event, counting it when it falls under
    /// `other`.
    pub fn event_network_label(&self, network: Option<&str>) -> String {
        let label = self.network_label(network);
        if label == OTHER_NETWORK && network != Some(OTHER_NETWORK) {
            self.label_overflow.inc();
        }
        label
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_labels_are_valid_names_and_bounded_in_number() {
        let metrics = IpamMetrics::register(&Registry::new()).unwrap();
        assert_eq!(metrics.network_label(None), "");
        let hostile = format!("net\n{}", "x".repeat(10 * 1024));
        assert_eq!(metrics.event_network_label(Some(&hostile)), OTHER_NETWORK);
        assert_eq!(metrics.label_overflow.get(), 1);
        for i in 0..MAX_NETWORK_LABELS {
            let name = format!("net{i}");
            assert_eq!(metrics.event_network_label(Some(&name)), name);
        }
        assert_eq!(metrics.event_network_label(Some("net0")), "net0");
        assert_eq!(metrics.event_network_label(Some("one-more")), OTHER_NETWORK);
        assert_eq!(metrics.label_overflow.get(), 2);
    }
}
