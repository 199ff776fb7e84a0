//! The datapath writes the kernel refused, kept until a retry goes through: at most one per
//! address (the last the registry wanted), so the set is bounded by the registry's size, and
//! each write or retry touches its own address's entry alone (O(1)).

use std::{
    collections::{hash_map::Entry, HashMap},
    net::IpAddr,
    time::SystemTime,
};

use ipq_api::{model::PendingWriteView, MapWrite};
use ipq_common::addr::AddrEntry;

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

#[derive(Debug, Default)]
pub struct PendingWrites {
    by_addr: HashMap<IpAddr, PendingWrite>,
}

impl PendingWrites {
    /// Records a failed attempt at `wanted` for `addr` (it replaces an older wish); whether
    /// the address had nothing pending before.
    pub fn failed(&mut self, addr: IpAddr, wanted: WantedWrite, error: String) -> bool {
        match self.by_addr.entry(addr) {
            Entry::Occupied(mut pending) => {
                let pending = pending.get_mut();
                pending.wanted = wanted;
                pending.error = error;
                pending.failures = pending.failures.saturating_add(1);
                false
            }
            Entry::Vacant(slot) => {
                slot.insert(PendingWrite {
                    wanted,
                    error,
                    failures: 1,
                    since: SystemTime::now(),
                });
                true
            }
        }
    }

    /// The map holds what the registry wants for `addr`: the write pending for it, if any,
    /// is over (returned).
    pub fn settled(&mut self, addr: IpAddr) -> Option<PendingWrite> {
        // Nearly always empty: no hashing on the writer's path then.
        if self.by_addr.is_empty() {
            return None;
        }
        self.by_addr.remove(&addr)
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
    pub fn any(&self) -> Option<(IpAddr, &PendingWrite)> {
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
