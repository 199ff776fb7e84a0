//! Entries keyed by (key, interface), indexed by interface as well: an interface going away
//! removes its own entries, O(k log n) for its k entries, never a scan of every interface's.
//!
//! The entries are private to this module, so the state built on them cannot scan them except
//! through [`ByInterface::iter`], which is for resyncs only and counted in tests (see
//! [`full_scans`]): a scan reintroduced on a per-event path makes a unit test fail.

use std::collections::{BTreeMap, BTreeSet};

/// (key, interface) → value, with the keys of each interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ByInterface<K: Ord, V> {
    entries: BTreeMap<(K, u32), V>,
    /// Interface → its keys; an interface with none has no entry (so equal contents compare
    /// equal, whatever came and went before).
    of_interface: BTreeMap<u32, BTreeSet<K>>,
}

impl<K: Ord, V> Default for ByInterface<K, V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            of_interface: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Copy, V> ByInterface<K, V> {
    /// Sets the value of (key, ifindex); returns the one it replaces.
    pub fn insert(&mut self, key: K, ifindex: u32, value: V) -> Option<V> {
        self.of_interface.entry(ifindex).or_default().insert(key);
        self.entries.insert((key, ifindex), value)
    }

    pub fn remove(&mut self, key: K, ifindex: u32) -> Option<V> {
        let removed = self.entries.remove(&(key, ifindex))?;
        if let Some(keys) = self.of_interface.get_mut(&ifindex) {
            keys.remove(&key);
            if keys.is_empty() {
                self.of_interface.remove(&ifindex);
            }
        }
        Some(removed)
    }

    pub fn get(&self, key: K, ifindex: u32) -> Option<&V> {
        self.entries.get(&(key, ifindex))
    }

    pub fn contains(&self, key: K, ifindex: u32) -> bool {
        self.entries.contains_key(&(key, ifindex))
    }

    /// The entries of `key` on any interface: adjacent in the map, a range, not a scan.
    pub fn of_key(&self, key: K) -> impl Iterator<Item = (u32, &V)> + '_ {
        self.entries
            .range((key, u32::MIN)..=(key, u32::MAX))
            .map(|((_, ifindex), value)| (*ifindex, value))
    }

    /// Removes every entry on `ifindex`, returning them: O(k log n) for its k entries.
    pub fn remove_interface(&mut self, ifindex: u32) -> Vec<(K, V)> {
        let Some(keys) = self.of_interface.remove(&ifindex) else {
            return Vec::new();
        };
        keys.into_iter()
            .filter_map(|key| Some((key, self.entries.remove(&(key, ifindex))?)))
            .collect()
    }

    /// Every entry in (key, interface) order: a full scan, for a resync's diff only.
    pub fn iter(&self) -> impl Iterator<Item = (K, u32, &V)> + '_ {
        note_full_scan();
        self.entries
            .iter()
            .map(|((key, ifindex), value)| (*key, *ifindex, value))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the interface index lists exactly the entries; for tests.
    #[cfg(test)]
    pub fn check_index(&self) -> Result<(), crate::invariant::InvariantViolation>
    where
        K: std::fmt::Debug,
    {
        let mut rebuilt: BTreeMap<u32, BTreeSet<K>> = BTreeMap::new();
        for (key, ifindex) in self.entries.keys() {
            rebuilt.entry(*ifindex).or_default().insert(*key);
        }
        crate::invariant::same_index("interface index", &self.of_interface, &rebuilt)
    }
}

/// (interface, key) pairs, interface first: an interface's keys are one range of the set, so
/// no second index (and no second copy of every key) is needed to remove them. For what is
/// only ever looked up by (key, interface) exactly, or by interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceSet<K: Ord> {
    entries: BTreeSet<(u32, K)>,
}

impl<K: Ord> Default for InterfaceSet<K> {
    fn default() -> Self {
        Self {
            entries: BTreeSet::new(),
        }
    }
}

impl<K: Ord + Copy + Bounded> InterfaceSet<K> {
    /// Adds (key, ifindex); returns whether it is new.
    pub fn insert(&mut self, key: K, ifindex: u32) -> bool {
        self.entries.insert((ifindex, key))
    }

    pub fn remove(&mut self, key: K, ifindex: u32) -> bool {
        self.entries.remove(&(ifindex, key))
    }

    pub fn contains(&self, key: K, ifindex: u32) -> bool {
        self.entries.contains(&(ifindex, key))
    }

    /// Removes every key of `ifindex`: O(k log n) for its k keys.
    pub fn remove_interface(&mut self, ifindex: u32) {
        let keys: Vec<(u32, K)> = self
            .entries
            .range((ifindex, K::MIN)..=(ifindex, K::MAX))
            .copied()
            .collect();
        for key in keys {
            self.entries.remove(&key);
        }
    }

    /// Every (key, interface) in (interface, key) order: a full scan, for a resync's diff and
    /// the rare rescan only.
    pub fn iter(&self) -> impl Iterator<Item = (K, u32)> + '_ {
        note_full_scan();
        self.entries.iter().map(|(ifindex, key)| (*key, *ifindex))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A key type's least and greatest values, to bound a range over one interface's keys.
pub trait Bounded {
    const MIN: Self;
    const MAX: Self;
}

impl Bounded for std::net::IpAddr {
    // Every IPv4 address orders before every IPv6 one.
    const MIN: Self = std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
    const MAX: Self = std::net::IpAddr::V6(std::net::Ipv6Addr::from_bits(u128::MAX));
}

#[cfg(test)]
thread_local! {
    static FULL_SCANS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn note_full_scan() {
    #[cfg(test)]
    FULL_SCANS.with(|n| n.set(n.get() + 1));
}

/// How many full scans of any [`ByInterface`] this thread made: per-event paths make none.
#[cfg(test)]
pub fn full_scans() -> u64 {
    FULL_SCANS.with(std::cell::Cell::get)
}
