//! What the ipq-ipam releaser asks the registry's owner: whether a held allocation's addresses
//! are free again. O(k) for the k addresses of one attachment.

use std::{collections::BTreeSet, net::IpAddr};

use ipq_api::model::HeldRelease;
use ipq_cni::spool;
use log::debug;

use super::Tracker;
use crate::{
    api::{
        command::AllocationQuery,
        model::{AddressList, AddressView, ErrorCode, IpamHoldView},
        views::ApiError,
    },
    ipam::holds::{Hold, Holds},
    registry::StateName,
};

impl Tracker {
    /// The addresses a live holder of attachment `container_id`/`ifname` holds. O(k).
    fn allocation_addresses<'a>(
        &'a self,
        container_id: &'a str,
        ifname: &'a str,
    ) -> impl Iterator<Item = IpAddr> + 'a {
        self.registry
            .held_by_container(container_id)
            .filter(move |r| {
                r.status
                    .holder()
                    .and_then(|h| h.cni_ifname())
                    .is_none_or(|known| known == ifname)
            })
            .map(|r| r.addr)
    }

    /// The addresses of `query`'s allocation still in the registry (Active, Draining or
    /// Quarantined): the ones it names, and those the registry has for its attachment. None
    /// means every address is free: its quarantine is over, or ipq never saw it used.
    pub(super) fn allocation_busy(&self, query: &AllocationQuery) -> AddressList {
        let of_attachment = self
            .registry
            .held_by_container(&query.container_id)
            .filter(|r| {
                r.status
                    .holder()
                    .and_then(|h| h.cni_ifname())
                    .is_none_or(|ifname| ifname == query.ifname)
            })
            .map(|r| r.addr);
        let wanted: BTreeSet<_> = query
            .addresses
            .iter()
            .copied()
            .chain(of_attachment)
            .collect();
        AddressList {
            addresses: wanted
                .into_iter()
                // The IPAM's own hold of a freed address is what waits on this answer.
                .filter_map(|addr| self.view(addr).ok().filter(|v| v.state != StateName::Free))
                .collect(),
        }
    }
}

impl Tracker {
    /// Stores `release` durably under `state_dir/ipam-releases`, its addresses completed with
    /// what the registry has for its attachment (at ipq-ipam's DEL the holder still lives, so
    /// a DEL without prevResult still names them). O(k) plus one file write and fsync, as a
    /// journal save.
    pub(super) fn hold_release(&self, mut release: HeldRelease) -> Result<HeldRelease, ApiError> {
        let known = self.allocation_addresses(&release.container_id, &release.ifname);
        let all: BTreeSet<IpAddr> = release.addresses.iter().copied().chain(known).collect();
        release.addresses = all.into_iter().collect();
        let dir = ipq_cni::paths::ipam_release_dir(&self.config.state_dir);
        let path = spool::spool(&dir, &release)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("storing the release: {e}")))?;
        debug!(
            "ipam: holding the allocation of container {} ({}) until {:?} are free ({})",
            release.container_id,
            release.ifname,
            release.addresses,
            path.display()
        );
        Ok(release)
    }
}

/// How `hold` of an address in `state` is given back.
fn hold_view(hold: Hold, state: StateName) -> IpamHoldView {
    let release = if hold.failures > 0 {
        "failing"
    } else if state == StateName::Free {
        "now"
    } else {
        "after the quarantine"
    };
    IpamHoldView {
        network: hold.network,
        container_id: hold.container_id,
        ifname: hold.ifname,
        release: release.to_owned(),
        error: hold
            .last_error
            .map(|e| format!("{e} ({} attempts)", hold.failures)),
    }
}

impl Tracker {
    /// The shared table of ipq-ipam's holds, for its releaser to keep up to date.
    pub fn ipam_holds(&self) -> Holds {
        self.ipam_holds.clone()
    }

    /// `view` with the IPAM's hold of its address, if there is one. O(log held).
    pub(super) fn with_ipam_hold(&self, mut view: AddressView) -> AddressView {
        view.ipam_hold = self
            .ipam_holds
            .get(view.address)
            .map(|hold| hold_view(hold, view.state));
        view
    }

    /// An address free in the registry that the IPAM still holds for ipq: its view says so.
    pub(super) fn held_free_view(&self, addr: IpAddr) -> Option<AddressView> {
        let hold = self.ipam_holds.get(addr)?;
        Some(AddressView {
            ipam_hold: Some(hold_view(hold, StateName::Free)),
            ..free_view(addr)
        })
    }

    /// Every address the IPAM holds that the registry has freed already: O(held).
    pub(super) fn held_free_views(&self) -> Vec<AddressView> {
        self.ipam_holds
            .all()
            .into_iter()
            .filter(|(addr, _)| self.registry.get(*addr).is_none())
            .filter_map(|(addr, _)| self.held_free_view(addr))
            .collect()
    }
}

/// The view of an address the registry does not hold.
fn free_view(addr: IpAddr) -> AddressView {
    AddressView {
        address: addr,
        state: StateName::Free,
        holder: None,
        previous_holder: None,
        fenced: None,
        blocked_claimant: None,
        displaced: Vec::new(),
        since: String::new(),
        until: None,
        last_stale: None,
        conflicts: 0,
        protection: None,
        attachment: None,
        observe_only: false,
        last_flush: None,
        ipam_hold: None,
    }
}
