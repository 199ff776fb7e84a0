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
    registry::StateName,
};

impl Tracker {
    /// Stores `release` durably under `state_dir/ipam-releases`, stamped with the agent's own
    /// time (what "never early" counts from) and its addresses completed with what the
    /// registry has for its attachment (at ipq-ipam's DEL the holder still lives, so a DEL
    /// without prevResult still names them). While the attachment's live holder holds
    /// addresses, one it names that the registry has no holder for at all is refused (409)
    /// and nothing stored: ipq-cni claimed every address of the pod's result, so that one is
    /// not the pod's. (One held by another holder is taken: an early reuse moves the pod's
    /// address to its new holder, and the old pod's DEL must still go through.) O(k) plus one
    /// file write and fsync, as a journal save.
    pub(super) fn hold_release(&self, mut release: HeldRelease) -> Result<HeldRelease, ApiError> {
        let api = self.api();
        let known: BTreeSet<IpAddr> = api
            .attachment_addresses(&release.container_id, &release.ifname)
            .collect();
        let unheld = |addr: &&IpAddr| {
            api.get(**addr)
                .map_or(true, |view| view.state == StateName::Free)
        };
        let foreign: Vec<String> = release
            .addresses
            .iter()
            .filter(|a| !known.is_empty() && !known.contains(a))
            .filter(unheld)
            .map(ToString::to_string)
            .collect();
        if !foreign.is_empty() {
            return Err(ApiError::new(
                ErrorCode::NotHolder,
                format!(
                    "addresses: {} held by nobody, while container {} ({}) holds {}: not its \
                     allocation's; nothing stored",
                    foreign.join(", "),
                    release.container_id,
                    release.ifname,
                    known
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let all: BTreeSet<IpAddr> = release.addresses.iter().copied().chain(known).collect();
        release.addresses = all.into_iter().collect();
        release.held_at_unix_ms = ipq_api::model::now_unix_ms();
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
