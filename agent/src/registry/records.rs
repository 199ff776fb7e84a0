//! The registry's records by address, each in a box of its own.
//!
//! Addresses mostly arrive in order (a netlink dump, a node's routes, a restore from the
//! journal), and a `BTreeMap` filled in order keeps its nodes a little over half full: with the
//! 104-byte record inline, a node of 11 cost about 1.3 KB for 6 records, some 224 bytes an
//! address (15 MB of the agent's heap at 65536). Boxed, a node holds 11 keys and pointers
//! (under 300 bytes) and each record is one allocation of its size: about 165 bytes an
//! address, whatever the order they came in. One more allocation per change of a record,
//! which costs nothing next to the change's own work.

use std::{collections::BTreeMap, net::IpAddr};

use super::AddrRecord;

#[derive(Debug, Default)]
pub(super) struct RecordMap(BTreeMap<IpAddr, Box<AddrRecord>>);

impl RecordMap {
    pub(super) fn get(&self, addr: &IpAddr) -> Option<&AddrRecord> {
        self.0.get(addr).map(|record| &**record)
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// In address order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &AddrRecord)> + '_ {
        self.0.iter().map(|(addr, record)| (addr, &**record))
    }

    /// In address order.
    pub(super) fn values(&self) -> impl Iterator<Item = &AddrRecord> + '_ {
        self.0.values().map(|record| &**record)
    }

    pub(super) fn remove(&mut self, addr: &IpAddr) -> Option<AddrRecord> {
        self.0.remove(addr).map(|record| *record)
    }

    pub(super) fn insert(&mut self, addr: IpAddr, record: AddrRecord) {
        self.0.insert(addr, Box::new(record));
    }
}
