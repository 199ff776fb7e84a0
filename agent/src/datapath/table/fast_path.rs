//! The per-interface fast-path slots (`IPQ_IFACES`): for each interface, the first
//! [`IFACE_OWN_ADDRS`] addresses whose packets may skip the hash lookup on it, rewritten from an
//! index of eligible addresses in O(log n), whatever the table holds. A slot another interface
//! hashes to first is left to it (that interface takes the hash-map path).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ipq_api::CheckedMap;
use ipq_common::{
    addr::{AddrEntry, AddrKey, NO_IFINDEX},
    iface::{iface_slot, IfaceEntry, IFACE_OWN_ADDRS},
};

use super::{drift::MapDrift, fast_path_eligible};
use crate::datapath::{intent::IntentFeed, maps::IfaceSlots, DatapathError};

pub(super) struct FastPath {
    slots: IfaceSlots,
    /// For each interface, the addresses it may list in its fast-path slot (in key order: the
    /// slot lists the first [`IFACE_OWN_ADDRS`]). Kept in step with the table's entries.
    eligible: HashMap<u32, BTreeSet<AddrKey>>,
    /// Which interface each used slot describes.
    slot_owner: HashMap<u32, u32>,
    /// Every slot written, for the verification's mirror.
    feed: IntentFeed,
}

impl FastPath {
    /// The slots over `slots`, indexing the eligible addresses of `entries` (the slots
    /// themselves are rewritten by [`Self::rebuild`]).
    pub(super) fn new(
        slots: IfaceSlots,
        entries: &BTreeMap<AddrKey, AddrEntry>,
        feed: IntentFeed,
    ) -> Self {
        let mut eligible: HashMap<u32, BTreeSet<AddrKey>> = HashMap::new();
        for (addr, entry) in entries {
            if fast_path_eligible(entry.holder_ifindex, entry) {
                eligible
                    .entry(entry.holder_ifindex)
                    .or_default()
                    .insert(*addr);
            }
        }
        Self {
            slots,
            eligible,
            slot_owner: HashMap::new(),
            feed,
        }
    }

    /// Clears what a previous agent left in the slots, then writes the slot of each of
    /// `holders`.
    pub(super) fn rebuild(&mut self, holders: &[u32]) -> Result<(), DatapathError> {
        for slot in 0..self.slots.len() {
            let current = self.slots.get(slot)?;
            if current.ifindex != 0 {
                self.slots.set(slot, &IfaceEntry::default())?;
            }
        }
        for &ifindex in holders {
            self.write(ifindex, None)?;
        }
        Ok(())
    }

    /// Updates the eligibility index with the change of `addr` (its slots are rewritten by
    /// [`Self::write`]).
    pub(super) fn record(
        &mut self,
        addr: AddrKey,
        old: Option<&AddrEntry>,
        new: Option<&AddrEntry>,
    ) {
        if let Some(old) = old {
            if fast_path_eligible(old.holder_ifindex, old) {
                if let Some(own) = self.eligible.get_mut(&old.holder_ifindex) {
                    own.remove(&addr);
                    if own.is_empty() {
                        self.eligible.remove(&old.holder_ifindex);
                    }
                }
            }
        }
        if let Some(entry) = new {
            if fast_path_eligible(entry.holder_ifindex, entry) {
                self.eligible
                    .entry(entry.holder_ifindex)
                    .or_default()
                    .insert(addr);
            }
        }
    }

    /// Rewrites the slot of `ifindex` from the index; with `Some((addr, keep))`, `addr` is
    /// listed only if `keep` (the transition's intermediate state).
    pub(super) fn write(
        &mut self,
        ifindex: u32,
        pending: Option<(AddrKey, bool)>,
    ) -> Result<(), DatapathError> {
        if ifindex == NO_IFINDEX {
            return Ok(());
        }
        let slot = iface_slot(ifindex);
        match self.slot_owner.get(&slot) {
            Some(&owner) if owner != ifindex => return Ok(()), // collision: hash-map path
            _ => {}
        }
        let own = self.listing(ifindex, pending);
        let mut value = IfaceEntry::default();
        if !own.is_empty() {
            value.ifindex = ifindex;
            value.own[..own.len()].copy_from_slice(&own);
            self.slot_owner.insert(slot, ifindex);
        } else {
            self.slot_owner.remove(&slot);
        }
        if self.slots.get(slot)? != value {
            self.slots.set(slot, &value)?;
        }
        self.feed.slot(slot, &value);
        Ok(())
    }

    /// The first [`IFACE_OWN_ADDRS`] eligible addresses of `ifindex` in key order, with the
    /// pending address listed or not as the transition says: O(log n), whatever the table holds.
    fn listing(&self, ifindex: u32, pending: Option<(AddrKey, bool)>) -> Vec<AddrKey> {
        let mut own: Vec<AddrKey> = self
            .eligible
            .get(&ifindex)
            .into_iter()
            .flatten()
            .filter(|addr| pending.is_none_or(|(pending_addr, _)| **addr != pending_addr))
            .take(IFACE_OWN_ADDRS)
            .copied()
            .collect();
        if let Some((addr, true)) = pending {
            own.push(addr);
            own.sort_unstable();
            own.truncate(IFACE_OWN_ADDRS);
        }
        own
    }

    /// What [`Self::write`] keeps in `slot` when no write is under way.
    fn expected(&self, slot: u32) -> IfaceEntry {
        let mut value = IfaceEntry::default();
        if let Some(&owner) = self.slot_owner.get(&slot) {
            let own = self.listing(owner, None);
            if !own.is_empty() {
                value.ifindex = owner;
                value.own[..own.len()].copy_from_slice(&own);
            }
        }
        value
    }

    /// What every slot holds when no write is under way, for the verification's mirror.
    pub(super) fn expected_all(&self) -> Vec<IfaceEntry> {
        (0..self.slots.len())
            .map(|slot| self.expected(slot))
            .collect()
    }

    /// Looks at `slot` again (a suspect of the comparison) and writes what it should hold back
    /// if the kernel still has something else.
    pub(super) fn recheck(&mut self, slot: u32, drift: &mut Vec<MapDrift>) {
        let want = self.expected(slot);
        self.feed.slot(slot, &want);
        let now = match self.slots.get(slot) {
            Ok(now) if now == want => return,
            Ok(now) => describe_iface(&now),
            Err(e) => format!("unreadable ({e})"),
        };
        drift.push(MapDrift {
            map: CheckedMap::IpqIfaces,
            key: format!("slot {slot}"),
            found: now,
            wanted: describe_iface(&want),
            error: self.slots.set(slot, &want).err().map(|e| e.to_string()),
        });
    }
}

/// The interfaces whose slots a change from `old` to `new` may touch.
pub(super) fn affected_interfaces(old: Option<&AddrEntry>, new: Option<&AddrEntry>) -> Vec<u32> {
    let mut ifaces: Vec<u32> = [old, new]
        .into_iter()
        .flatten()
        .map(|e| e.holder_ifindex)
        .filter(|&i| i != NO_IFINDEX)
        .collect();
    ifaces.sort_unstable();
    ifaces.dedup();
    ifaces
}

fn describe_iface(entry: &IfaceEntry) -> String {
    if entry.ifindex == 0 {
        return "empty".to_owned();
    }
    let own: Vec<String> = entry
        .own
        .iter()
        .filter(|a| **a != AddrKey::UNSPECIFIED)
        .map(|a| a.to_ip().to_string())
        .collect();
    format!("if{} fast path for [{}]", entry.ifindex, own.join(", "))
}
