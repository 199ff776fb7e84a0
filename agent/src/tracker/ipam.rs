//! What ipq-ipam asks the registry's owner to keep: the releases it holds until their
//! addresses are free, and the shared table of its holds. (What the API shows of them is the
//! API service's.)

use std::{collections::BTreeSet, net::IpAddr};

use ipq_api::model::HeldRelease;
use ipq_cni::{paths, spool};
use log::debug;

use super::Tracker;
use crate::{
    api::{model::ErrorCode, views::ApiError},
    ipam::holds::Holds,
};

impl Tracker {
    /// Stores `release` durably under `state_dir/ipam-releases`, its addresses completed with
    /// what the registry has for its attachment (at ipq-ipam's DEL the holder still lives, so
    /// a DEL without prevResult still names them). O(k) plus one file write and fsync, as a
    /// journal save.
    pub(super) fn hold_release(&self, mut release: HeldRelease) -> Result<HeldRelease, ApiError> {
        let api = self.api();
        let known = api.attachment_addresses(&release.container_id, &release.ifname);
        let all: BTreeSet<IpAddr> = release.addresses.iter().copied().chain(known).collect();
        release.addresses = all.into_iter().collect();
        let dir = paths::ipam_release_dir(&self.config.state_dir);
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

    /// The shared table of ipq-ipam's holds, for its releaser to keep up to date.
    pub fn ipam_holds(&self) -> Holds {
        self.ipam_holds.clone()
    }
}
