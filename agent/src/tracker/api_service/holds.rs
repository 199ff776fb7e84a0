//! What the API shows of ipq-ipam's holds: an address's hold in its view, the freed addresses
//! the IPAM still holds (both [`IpamSide`]'s), and which addresses of a held allocation are not
//! free yet (its releaser's question). O(k) for the k addresses of one attachment.

use std::{collections::BTreeSet, net::IpAddr};

use super::{super::ipam::IpamSide, ApiService};
use ipq_api::HoldRelease;

use crate::{
    api::{
        command::AllocationQuery,
        model::{AddressList, AddressView, IpamHoldView},
    },
    ipam::holds::Hold,
    registry::{Registry, StateName},
};

impl<'a> ApiService<'a> {
    /// The addresses a live holder of attachment `container_id`/`ifname` holds. O(k).
    pub fn attachment_addresses<'q>(
        &self,
        container_id: &'q str,
        ifname: &'q str,
    ) -> impl Iterator<Item = IpAddr> + 'q
    where
        'a: 'q,
    {
        self.core
            .registry
            .records()
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
    pub fn allocation_busy(&self, query: &AllocationQuery) -> AddressList {
        let of_attachment = self.attachment_addresses(&query.container_id, &query.ifname);
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
                .filter_map(|addr| self.get(addr).ok().filter(|v| v.state != StateName::Free))
                .collect(),
        }
    }
}

impl IpamSide {
    /// The IPAM's hold of `view`'s address, if there is one, in its view. O(log held).
    pub(in crate::tracker) fn annotate(&self, view: &mut AddressView) {
        view.ipam_hold = self
            .holds
            .get(view.address)
            .map(|hold| hold_view(hold, view.state));
    }

    /// An address free in the registry that the IPAM still holds for ipq: its view says so.
    pub(in crate::tracker) fn held_free_view(&self, addr: IpAddr) -> Option<AddressView> {
        let hold = self.holds.get(addr)?;
        Some(AddressView {
            ipam_hold: Some(hold_view(hold, StateName::Free)),
            ..AddressView::free(addr)
        })
    }

    /// Every address the IPAM holds that `registry` has freed already: O(held).
    pub(in crate::tracker) fn held_free_views(&self, registry: &Registry) -> Vec<AddressView> {
        self.holds
            .all()
            .into_iter()
            .filter(|(addr, _)| registry.records().get(*addr).is_none())
            .filter_map(|(addr, _)| self.held_free_view(addr))
            .collect()
    }
}

/// How `hold` of an address in `state` is given back.
fn hold_view(hold: Hold, state: StateName) -> IpamHoldView {
    let release = if hold.failures > 0 {
        HoldRelease::Failing
    } else if state == StateName::Free {
        HoldRelease::Now
    } else {
        HoldRelease::AfterQuarantine
    };
    IpamHoldView {
        network: hold.network,
        container_id: hold.container_id,
        ifname: hold.ifname,
        release,
        error: hold
            .last_error
            .map(|e| format!("{e} ({} attempts)", hold.failures)),
    }
}
