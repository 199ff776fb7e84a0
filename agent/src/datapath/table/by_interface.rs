//! The addresses `IPQ_ADDRS` holds per interface (its holder's, and those fenced there), kept
//! by the table as it writes, for what must know them off the owner loop without reading the
//! whole map: the judge of a co-tenant ahead of ipq's program
//! ([`crate::datapath::attach::cotenant`]), which runs that co-tenant on a packet of each.
//!
//! One process-wide index (the table is the map's one writer, and there is one table per
//! agent); O(log n) per write, read under a short lock.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Mutex, MutexGuard},
};

use ipq_common::addr::{AddrEntry, AddrKey, NO_IFINDEX};

static BY_INTERFACE: Mutex<BTreeMap<u32, BTreeSet<AddrKey>>> = Mutex::new(BTreeMap::new());

fn index() -> MutexGuard<'static, BTreeMap<u32, BTreeSet<AddrKey>>> {
    BY_INTERFACE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The interfaces an entry concerns: its holder's and the one fenced.
fn interfaces(entry: &AddrEntry) -> impl Iterator<Item = u32> {
    [entry.holder_ifindex, entry.fenced_ifindex]
        .into_iter()
        .filter(|i| *i != NO_IFINDEX)
}

/// Replaces the index with what `held` holds (the table just opened).
pub(super) fn rebuild<'a>(held: impl Iterator<Item = (&'a AddrKey, &'a AddrEntry)>) {
    let mut index = index();
    index.clear();
    for (addr, entry) in held {
        for ifindex in interfaces(entry) {
            index.entry(ifindex).or_default().insert(*addr);
        }
    }
}

/// `addr` went from `old` to `new` (`None`: not in the map).
pub(super) fn record(addr: AddrKey, old: Option<&AddrEntry>, new: Option<&AddrEntry>) {
    let mut index = index();
    for ifindex in old.into_iter().flat_map(interfaces) {
        if let Some(set) = index.get_mut(&ifindex) {
            set.remove(&addr);
            if set.is_empty() {
                index.remove(&ifindex);
            }
        }
    }
    for ifindex in new.into_iter().flat_map(interfaces) {
        index.entry(ifindex).or_default().insert(addr);
    }
}

/// The addresses of `ifindex`, in address order.
pub fn of(ifindex: u32) -> Vec<IpAddr> {
    index()
        .get(&ifindex)
        .map(|set| set.iter().map(AddrKey::to_ip).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipq_common::addr::AddrState;

    #[test]
    fn an_address_is_listed_under_its_holder_and_where_it_is_fenced_until_it_goes() {
        // Interface numbers of this test's own: the index is process-wide.
        let (holder, fenced) = (900_001, 900_002);
        let addr = AddrKey::from_ip("10.9.0.1".parse().unwrap());
        let entry = AddrEntry::new(AddrState::Active, holder, 0).with_fenced(fenced);
        record(addr, None, Some(&entry));
        assert_eq!(of(holder), vec!["10.9.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(of(fenced), of(holder));
        let moved = AddrEntry::new(AddrState::Active, holder, 0);
        record(addr, Some(&entry), Some(&moved));
        assert!(of(fenced).is_empty(), "no longer fenced there");
        record(addr, Some(&moved), None);
        assert!(of(holder).is_empty());
    }
}
