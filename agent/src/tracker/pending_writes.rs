//! The datapath writes the kernel refused, kept until a retry goes through: at most one per
//! address (the last the registry wanted), so the set is bounded by the registry's size, and
//! each write or retry touches its own address's entry alone (O(1)). Each refusal is counted
//! (`ipq_datapath_write_failures_total{op}`), the set's size is a gauge, and while it is not
//! empty `/readyz` fails and says which.

use std::{
    collections::{hash_map::Entry, HashMap},
    net::IpAddr,
    sync::Arc,
    time::SystemTime,
};

use ipq_api::{model::PendingWriteView, MapWrite};
use ipq_common::addr::AddrEntry;
use log::{debug, error, info};

use crate::{datapath::DatapathError, metrics::Metrics};

/// What the registry wants done to an address's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WantedWrite {
    Update(AddrEntry),
    Delete,
}

impl WantedWrite {
    pub fn kind(self) -> MapWrite {
        match self {
            Self::Update(_) => MapWrite::Update,
            Self::Delete => MapWrite::Delete,
        }
    }
}

/// A refused write: what is wanted, and how trying it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingWrite {
    pub wanted: WantedWrite,
    /// The kernel's answer to the last attempt.
    pub error: String,
    pub failures: u32,
    pub since: SystemTime,
}

impl PendingWrite {
    pub fn view(&self, address: IpAddr) -> PendingWriteView {
        PendingWriteView {
            address,
            op: self.wanted.kind(),
            error: self.error.clone(),
            failures: self.failures,
            since: humantime::format_rfc3339_millis(self.since).to_string(),
        }
    }
}

pub struct PendingWrites {
    by_addr: HashMap<IpAddr, PendingWrite>,
    /// Addresses refused since none was pending: one ERROR line per burst, each address at
    /// debug (a map that fills refuses thousands at once), and the count when the burst ends.
    pub(super) refused_in_burst: u64,
    pub(super) metrics: Arc<Metrics>,
}

impl PendingWrites {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            by_addr: HashMap::new(),
            refused_in_burst: 0,
            metrics,
        }
    }

    /// A write refused: counted every time, kept (replacing an older wish for `addr`) for the
    /// next tick. The first address of a burst is an ERROR line; the others, refused while it
    /// pends, are at debug (the retries are counted, not logged), and the burst's end says how
    /// many there were.
    pub fn failed(&mut self, addr: IpAddr, wanted: WantedWrite, e: &DatapathError) {
        let op = wanted.kind();
        self.metrics
            .writes
            .failures
            .with_label_values(&[op.as_ref()])
            .inc();
        let error = e.to_string();
        match self.by_addr.entry(addr) {
            Entry::Occupied(mut pending) => {
                let pending = pending.get_mut();
                pending.wanted = wanted;
                pending.error = error;
                pending.failures = pending.failures.saturating_add(1);
                return;
            }
            Entry::Vacant(slot) => {
                slot.insert(PendingWrite {
                    wanted,
                    error,
                    failures: 1,
                    since: SystemTime::now(),
                });
            }
        }
        self.refused_in_burst += 1;
        if self.refused_in_burst == 1 {
            error!(
                "{addr}: datapath {op} refused, retried every tick; the kernel enforces the \
                 entry it had until then: {e} (other addresses refused before every pending \
                 write goes through are logged at debug; `ipq status` lists them)"
            );
        } else {
            debug!("{addr}: datapath {op} refused, retried every tick: {e}");
        }
        self.observe();
    }

    /// The map holds what the registry wants for `addr`: the write pending for it, if any,
    /// is over.
    pub fn settled(&mut self, addr: IpAddr) {
        // Nearly always empty: no hashing on the writer's path then.
        if self.by_addr.is_empty() {
            return;
        }
        let Some(pending) = self.by_addr.remove(&addr) else {
            return;
        };
        // Per address at debug: a full map that frees can settle thousands at once; the INFO
        // line says when none is left.
        debug!(
            "{addr}: datapath {} went through after {} refused attempts",
            pending.wanted.kind(),
            pending.failures
        );
        if self.by_addr.is_empty() {
            info!(
                "datapath writes: every refused write has gone through ({} addresses were \
                 refused)",
                self.refused_in_burst
            );
            self.refused_in_burst = 0;
        }
        self.observe();
    }

    /// The gauge and readiness, where the set of pending addresses changed: O(1).
    fn observe(&self) {
        self.metrics.writes.pending.set(self.by_addr.len() as i64);
        let blocker = self.any().map(|(addr, pending)| {
            format!(
                "datapath writes refused by the kernel for {} addresses (retried every tick), \
                 e.g. {} of {addr}: {}",
                self.by_addr.len(),
                pending.wanted.kind(),
                pending.error
            )
        });
        self.metrics.readiness.set_writes_pending(blocker);
    }

    pub fn get(&self, addr: IpAddr) -> Option<&PendingWrite> {
        self.by_addr.get(&addr)
    }

    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// What to try again, one per address: O(pending).
    pub fn wanted(&self) -> Vec<(IpAddr, WantedWrite)> {
        self.by_addr
            .iter()
            .map(|(addr, pending)| (*addr, pending.wanted))
            .collect()
    }

    /// Any one of them (for a readiness line): O(1).
    fn any(&self) -> Option<(IpAddr, &PendingWrite)> {
        self.by_addr.iter().next().map(|(addr, p)| (*addr, p))
    }

    /// Up to `limit` of them in address order, for `/v1/status`: O(pending), and pending
    /// writes are few unless the kernel refuses every write.
    pub fn views(&self, limit: usize) -> Vec<PendingWriteView> {
        let mut all: Vec<(&IpAddr, &PendingWrite)> = self.by_addr.iter().collect();
        all.sort_unstable_by_key(|(addr, _)| **addr);
        all.into_iter()
            .take(limit)
            .map(|(addr, pending)| pending.view(*addr))
            .collect()
    }
}
