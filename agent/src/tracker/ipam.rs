//! ipq-ipam's side of the registry's owner: the records of its allocations, the releases it
//! holds until their addresses are free, the shared table of its holds and the releaser's
//! queue for pool pressure (`ipam_pressure`), owned together by [`IpamSide`]. (What the API
//! shows of them is the API service's.)

use std::{collections::BTreeSet, net::IpAddr};

use ipq_api::model::{AllocationRecord, HeldRelease};
use ipq_fs::{paths, spool};
use log::{debug, warn};

use tokio::sync::mpsc;

use super::api_service::ApiService;
use crate::{
    api::{model::ErrorCode, views::ApiError},
    ipam::{holds::Holds, records::Records, releaser::Urgent},
    metrics::Metrics,
    registry::StateName,
};

/// What the registry's owner keeps for ipq-ipam.
pub(super) struct IpamSide {
    /// The allocations ipq-ipam holds, as its releaser last saw them.
    pub(super) holds: Holds,
    /// The records of ipq-ipam's allocations: what a release may run.
    records: Records,
    /// The releaser's queue of releases wanted now (pool pressure); none in tests.
    urgent: Option<mpsc::Sender<Urgent>>,
    /// Where released allocations are stored (`state_dir/ipam-releases`).
    release_dir: std::path::PathBuf,
}

impl IpamSide {
    pub(super) fn new(state_dir: &std::path::Path, capacity: usize) -> Self {
        Self {
            holds: Holds::default(),
            records: Records::new(paths::ipam_allocation_dir(state_dir), capacity),
            urgent: None,
            release_dir: paths::ipam_release_dir(state_dir),
        }
    }

    /// The releaser's queue for pool pressure.
    pub(super) fn set_releaser(&mut self, urgent: mpsc::Sender<Urgent>) {
        self.urgent = Some(urgent);
    }

    /// The releaser's queue, when one runs.
    pub(super) fn urgent(&self) -> Option<&mpsc::Sender<Urgent>> {
        self.urgent.as_ref()
    }

    /// Stores a release durably under `state_dir/ipam-releases`, stamped with the agent's own
    /// time (what "never early" counts from). What it runs is its allocation's record, never
    /// the request: a request naming another delegate, or an address the allocation did not
    /// get, is refused (409) and nothing stored. A release with no record (an allocation an
    /// older ipq-ipam made) is taken as [`unrecorded`](Self::unrecorded). Its addresses are
    /// completed with what the registry has for its attachment (at ipq-ipam's DEL the holder
    /// still lives, so a DEL without prevResult still names them). O(k) plus one file write
    /// and fsync, as a journal save.
    pub(super) fn hold_release(
        &self,
        release: HeldRelease,
        api: &ApiService<'_>,
        metrics: &Metrics,
    ) -> Result<HeldRelease, ApiError> {
        let record = self.records.get(
            release.network.as_deref(),
            &release.container_id,
            &release.ifname,
        );
        let known: BTreeSet<IpAddr> = api
            .attachment_addresses(&release.container_id, &release.ifname)
            .collect();
        let dir = &self.release_dir;
        // A recorded allocation's release has one file, named after the record: a runtime
        // repeating its DEL gets the release stored first (its time, and so its wait, kept).
        let stored_at = record.as_ref().map(|r| dir.join(release_file_name(r)));
        let mut release = match &record {
            Some(record) => recorded(&release, record)?,
            None => unrecorded(release, &known, api, metrics)?,
        };
        if let Some(stored) = stored_at.as_deref().and_then(read_stored) {
            return Ok(stored);
        }
        let all: BTreeSet<IpAddr> = release.addresses.iter().copied().chain(known).collect();
        release.addresses = all.into_iter().collect();
        release.held_at_unix_ms = ipq_api::model::now_unix_ms();
        let stored = match &stored_at {
            Some(path) => spool::write_at(path, &release).map(|()| path.clone()),
            None => spool::spool(dir, &release),
        };
        let path = stored
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
    pub(super) fn holds(&self) -> Holds {
        self.holds.clone()
    }

    /// The records of ipq-ipam's allocations, for its releaser to adopt and forget.
    pub(super) fn records(&self) -> Records {
        self.records.clone()
    }
}

/// A release with no record: an allocation an older ipq-ipam made before the upgrade
/// (refusing its DEL would leave the pod Terminating for good). Taken as given (the body
/// was checked at the door: its delegate is its config's IPAM plugin, from a trusted
/// directory; its DEL runs without a netns), counted and logged. While the attachment's
/// live holder holds addresses, one it names that the registry has no holder for at all
/// is refused (409): ipq-cni claimed every address of the pod's result, so that one is not
/// the pod's. (One held by another holder is taken: an early reuse moves the pod's address
/// to its new holder, and the old pod's DEL must still go through.)
fn unrecorded(
    release: HeldRelease,
    known: &BTreeSet<IpAddr>,
    api: &ApiService<'_>,
    metrics: &Metrics,
) -> Result<HeldRelease, ApiError> {
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
                listed(known.iter())
            ),
        ));
    }
    let label = metrics.ipam.event_network_label(release.network.as_deref());
    metrics
        .ipam_releases
        .with_label_values(&[label.as_str(), "unrecorded"])
        .inc();
    warn!(
        "ipam: the release of container {} ({}) has no allocation record (made before \
         ipq-ipam recorded allocations?); taken as given, its {} DEL run without a netns",
        release.container_id, release.ifname, release.delegate_type
    );
    Ok(release)
}

/// The release of `record`'s allocation that `request` asks for: the record's, or a 409 naming
/// what differed.
fn recorded(request: &HeldRelease, record: &AllocationRecord) -> Result<HeldRelease, ApiError> {
    let differs = |what: String| {
        Err(ApiError::new(
            ErrorCode::NotHolder,
            format!(
                "{what}; the allocation of container {} ({}) was recorded at its ADD, and a \
                 release can only complete that; nothing stored",
                record.container_id, record.ifname
            ),
        ))
    };
    if request.delegate_type != record.delegate_type {
        return differs(format!(
            "delegateType: {:?}, but the allocation was made by {:?}",
            request.delegate_type, record.delegate_type
        ));
    }
    let foreign: Vec<&IpAddr> = request
        .addresses
        .iter()
        .filter(|a| !record.addresses.contains(a))
        .collect();
    if !foreign.is_empty() {
        return differs(format!(
            "addresses: {} not of the allocation, which got {}",
            listed(foreign.into_iter()),
            listed(record.addresses.iter())
        ));
    }
    Ok(record.release_at(0))
}

/// The release file of `record`'s allocation: a spool name (`del-`…`.json`) after the
/// record's own.
fn release_file_name(record: &AllocationRecord) -> String {
    let name = record.file_name();
    format!("del-{}", name.trim_start_matches("alloc-"))
}

/// The release stored at `path`, if there is one that reads.
fn read_stored(path: &std::path::Path) -> Option<HeldRelease> {
    let bytes = ipq_fs::safe_fs::read_regular(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn listed<'a>(addresses: impl Iterator<Item = &'a IpAddr>) -> String {
    let all: Vec<String> = addresses.map(ToString::to_string).collect();
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.join(", ")
    }
}
