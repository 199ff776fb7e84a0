//! Break-glass writes of single datapath entries, through the agent: with an agent running,
//! `ipq-agent datapath set|delete` refuse (the agent is the maps' one writer), and
//! `PUT|DELETE /v1/datapath/{ip}` do the same write on the agent's own loop instead. The
//! registry does not know: its next change of that address writes over it.

use std::net::IpAddr;

use ipq_common::addr::{AddrEntry, AddrState, NO_IFINDEX};
use log::warn;

use super::Tracker;
use crate::registry::StateName;
use crate::{
    api::{
        model::{DatapathEntryRequest, DatapathEntryView, ErrorCode},
        views::ApiError,
    },
    netdev,
};

fn view(addr: IpAddr, entry: &AddrEntry) -> DatapathEntryView {
    DatapathEntryView {
        address: addr,
        state: StateName::of_raw_entry(entry.state()).to_owned(),
        holder_ifindex: entry.holder_ifindex,
        fenced_ifindex: entry.fenced_ifindex,
    }
}

fn ifindex(name: Option<&str>, what: &str) -> Result<u32, ApiError> {
    match name {
        None => Ok(NO_IFINDEX),
        Some(name) => netdev::ifindex(name).ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnknownInterface,
                format!("{what} interface {name:?} does not exist on this node"),
            )
        }),
    }
}

impl Tracker {
    pub(super) fn datapath_put(
        &mut self,
        addr: IpAddr,
        request: &DatapathEntryRequest,
    ) -> Result<DatapathEntryView, ApiError> {
        let state = StateName::parse_held(&request.state)
            .and_then(StateName::entry)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "state {:?}: give active, draining or quarantined",
                        request.state
                    ),
                )
            })?;
        let holder = ifindex(request.holder.as_deref(), "holder")?;
        let fenced = ifindex(request.fenced.as_deref(), "fenced")?;
        if state != AddrState::Quarantined && holder == NO_IFINDEX {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!("holder: required for an {} address", state.as_str()),
            ));
        }
        let entry = AddrEntry::new(state, holder, netdev::monotonic_ns()).with_fenced(fenced);
        self.enforcer
            .put_unchecked(addr, entry)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("{addr}: {e}")))?;
        warn!(
            "{addr}: datapath entry written by hand ({} holder if{holder} fenced if{fenced}); \
             the registry does not know",
            state.as_str()
        );
        Ok(view(addr, &entry))
    }

    pub(super) fn datapath_delete(&mut self, addr: IpAddr) -> Result<DatapathEntryView, ApiError> {
        let removed = self
            .enforcer
            .remove_unchecked(addr)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("{addr}: {e}")))?;
        let removed = removed.ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("{addr} is not in the datapath"),
            )
        })?;
        warn!("{addr}: datapath entry removed by hand; the registry does not know");
        Ok(view(addr, &removed))
    }
}
