//! Keeping the table's accelerators in step with an entry: the per-interface fast-path slot
//! (rewritten from the index of eligible addresses, O(log n)) and the quarantine filter's
//! reference-counted bits.

use ipq_common::{
    addr::{AddrEntry, AddrKey, NO_IFINDEX},
    filter::filter_position,
    iface::{iface_slot, IfaceEntry, IFACE_OWN_ADDRS},
};

use super::AddressTable;
use crate::datapath::DatapathError;

impl AddressTable {
    /// Rewrites the slot of `ifindex` from the table; with `Some((addr, keep))`, `addr` is listed
    /// only if `keep` (the transition's intermediate state).
    pub(super) fn write_slot(
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
    pub(super) fn listing(&self, ifindex: u32, pending: Option<(AddrKey, bool)>) -> Vec<AddrKey> {
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

    pub(super) fn filter_ref(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        let (word, mask) = filter_position(addr, self.filter_mask);
        let refs = self.filter_refs.entry((word, mask)).or_insert(0);
        *refs += 1;
        if *refs == 1 {
            self.filter_words[word as usize] |= mask;
            self.filter
                .set_word(word, self.filter_words[word as usize])?;
            self.feed.word(word, self.filter_words[word as usize]);
        }
        Ok(())
    }

    pub(super) fn filter_unref(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        let (word, mask) = filter_position(addr, self.filter_mask);
        if let Some(refs) = self.filter_refs.get_mut(&(word, mask)) {
            *refs -= 1;
            if *refs == 0 {
                self.filter_refs.remove(&(word, mask));
                self.filter_words[word as usize] &= !mask;
                self.filter
                    .set_word(word, self.filter_words[word as usize])?;
                self.feed.word(word, self.filter_words[word as usize]);
            }
        }
        Ok(())
    }
}

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
