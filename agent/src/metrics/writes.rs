//! The metrics of the datapath writer's own failures: writes of `IPQ_ADDRS` (and its copies)
//! the kernel refused, each kept pending and retried on every tick.

use ipq_api::MapWrite;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

use crate::series::registered;

pub struct WriteMetrics {
    /// Failed attempts, by operation (`update`, `delete`), retries included.
    pub failures: IntCounterVec,
    /// Addresses whose entry is not what the registry wants because its write failed.
    pub pending: IntGauge,
}

impl WriteMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let failures = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_datapath_write_failures_total",
                    "Writes of an address's datapath entry (IPQ_ADDRS and its copies) the \
                     kernel refused, by op (update, delete), retries included. Each is kept \
                     pending and retried every tick; meanwhile the kernel enforces the entry \
                     it had, the agent is not ready and a claim of that address is answered \
                     unavailable.",
                ),
                &["op"],
            )?,
        )?;
        for op in [MapWrite::Update, MapWrite::Delete] {
            failures.with_label_values(&[op.as_ref()]).inc_by(0);
        }
        let pending = registered(
            registry,
            IntGauge::new(
                "ipq_datapath_writes_pending",
                "Addresses whose datapath entry is not what the registry wants because the \
                 kernel refused its last write (retried every tick); 0 when every write went \
                 through.",
            )?,
        )?;
        Ok(Self { failures, pending })
    }
}
