//! Break-glass writes of single datapath entries, through the agent: with an agent running,
//! `ipq-agent datapath set|delete` refuse (the agent is the maps' one writer), and
//! `PUT|DELETE /v1/datapath/{ip}` do the same write on the agent's own loop instead. The
//! registry does not know: its next change of that address writes over it. (The request's
//! checks and the answer's view are the API service's.)

use std::{collections::HashMap, net::IpAddr};

use ipq_common::addr::AddrEntry;
use log::warn;

use super::effects::Sinks;
use crate::{
    datapath::DatapathError,
    registry::{datapath_entry, Registry},
};

/// Datapath entries written (`Some`) or removed (`None`) by hand, behind the registry's back,
/// until the registry next changes the address: what the verification keeps there.
#[derive(Debug, Default)]
pub(super) struct HandWritten(HashMap<IpAddr, Option<AddrEntry>>);

impl HandWritten {
    fn record(&mut self, addr: IpAddr, entry: Option<AddrEntry>) {
        self.0.insert(addr.to_canonical(), entry);
    }

    /// The registry writes over `addr`'s entry (O(1); nothing to do in the common case of
    /// none written by hand).
    pub(super) fn forget(&mut self, addr: IpAddr) {
        if !self.0.is_empty() {
            self.0.remove(&addr.to_canonical());
        }
    }

    /// The datapath mirrors the registry again (a sync after a netlink dump).
    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// The entry the map should hold for `addr`: the one written by hand, else the registry's.
    pub(super) fn wanted(&self, registry: &Registry, addr: IpAddr) -> Option<AddrEntry> {
        match self.0.get(&addr.to_canonical()) {
            Some(by_hand) => *by_hand,
            None => registry.records().get(addr).map(datapath_entry),
        }
    }
}

impl Sinks {
    /// Writes `entry` for `addr` behind the registry's back.
    pub(super) fn datapath_put(
        &mut self,
        addr: IpAddr,
        entry: AddrEntry,
    ) -> Result<(), DatapathError> {
        self.enforcer.put_unchecked(addr, entry)?;
        self.hand_written.record(addr, Some(entry));
        warn!(
            "{addr}: datapath entry written by hand ({} holder if{} fenced if{}); the registry \
             does not know",
            ipq_api::EntryState::of_raw(entry.state()),
            entry.holder_ifindex,
            entry.fenced_ifindex,
        );
        Ok(())
    }

    /// Removes the entry of `addr` behind the registry's back: the entry that was there.
    pub(super) fn datapath_delete(
        &mut self,
        addr: IpAddr,
    ) -> Result<Option<AddrEntry>, DatapathError> {
        let removed = self.enforcer.remove_unchecked(addr)?;
        self.hand_written.record(addr, None);
        if removed.is_some() {
            warn!("{addr}: datapath entry removed by hand; the registry does not know");
        }
        Ok(removed)
    }
}
