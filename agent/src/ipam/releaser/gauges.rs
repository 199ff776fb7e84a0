//! The releaser's gauges, set from each scan and retry table: this task alone keeps both
//! tables, so it alone sets what they count.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
};

use ipq_api::model::HeldRelease;
use ipq_fs::spool::Spooled;

use super::Retry;
use crate::metrics::Metrics;

/// `ipq_ipam_held_addresses` per network label from one scan; a label with none left reads 0.
pub(super) fn set_held_addresses(
    metrics: &Metrics,
    pending: &[Spooled<HeldRelease>],
    networks: &mut HashSet<String>,
) {
    // By label, not by name: networks past the label cap add up under `other`.
    let mut held: HashMap<String, i64> = HashMap::new();
    for spooled in pending {
        let label = metrics
            .ipam
            .network_label(spooled.request.network.as_deref());
        *held.entry(label).or_default() +=
            i64::try_from(spooled.request.addresses.len()).unwrap_or(i64::MAX);
    }
    for network in networks.iter() {
        if !held.contains_key(network.as_str()) {
            metrics
                .ipam_held_addresses
                .with_label_values(&[network.as_str()])
                .set(0);
        }
    }
    for (network, count) in held {
        metrics
            .ipam_held_addresses
            .with_label_values(&[network.as_str()])
            .set(count);
        networks.insert(network);
    }
}

/// `ipq_ipam_failing_releases`: the releases whose last DEL failed are exactly those with a
/// retry pending, and this task alone keeps that table (and so the gauge).
pub(super) fn set_failing(metrics: &Metrics, retries: &HashMap<PathBuf, Retry>) {
    metrics
        .ipam_failing_releases
        .set(i64::try_from(retries.len()).unwrap_or(i64::MAX));
}
