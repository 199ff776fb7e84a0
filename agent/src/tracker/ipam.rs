//! What the ipq-ipam releaser asks the registry's owner: whether a held allocation's addresses
//! are free again. O(k) for the k addresses of one attachment.

use std::{collections::BTreeSet, net::IpAddr};

use log::info;

use super::Tracker;
use crate::{
    api::{
        command::AllocationQuery,
        model::{AddressList, ErrorCode},
        views::ApiError,
    },
    cni::{ipam::release::HeldRelease, spool},
    paths,
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
                .filter_map(|addr| self.view(addr).ok())
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
        let dir = paths::ipam_release_dir(&self.config.state_dir);
        let path = spool::spool(&dir, &release)
            .map_err(|e| ApiError::new(ErrorCode::Internal, format!("storing the release: {e}")))?;
        info!(
            "ipam: holding the allocation of container {} ({}) until {:?} are free ({})",
            release.container_id,
            release.ifname,
            release.addresses,
            path.display()
        );
        Ok(release)
    }
}
