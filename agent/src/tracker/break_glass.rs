//! Break-glass writes of single datapath entries, through the agent: with an agent running,
//! `ipq-agent datapath set|delete` refuse (the agent is the maps' one writer), and
//! `PUT|DELETE /v1/datapath/{ip}` do the same write on the agent's own loop instead. The
//! registry does not know: its next change of that address writes over it. (The request's
//! checks and the answer's view are the API service's.)

use std::net::IpAddr;

use ipq_common::addr::AddrEntry;
use log::warn;

use super::Tracker;
use crate::datapath::DatapathError;

impl Tracker {
    /// Writes `entry` for `addr` behind the registry's back.
    pub(super) fn datapath_put(
        &mut self,
        addr: IpAddr,
        entry: AddrEntry,
    ) -> Result<(), DatapathError> {
        self.enforcer.put_unchecked(addr, entry)?;
        self.hand_written.insert(addr.to_canonical(), Some(entry));
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
        self.hand_written.insert(addr.to_canonical(), None);
        if removed.is_some() {
            warn!("{addr}: datapath entry removed by hand; the registry does not know");
        }
        Ok(removed)
    }
}
