//! ipq-ipam's side of the registry's owner: the records of its allocations, the releases it
//! holds until their addresses are free, the shared table of its holds and the releaser's
//! queue for pool pressure (`ipam_pressure`), owned together by [`IpamSide`]. (What the API
//! shows of them is the API service's.)

use std::{collections::BTreeSet, net::IpAddr};

use ipq_api::model::{AllocationRecord, HeldRelease};
use ipq_fs::paths;
use log::warn;

use tokio::sync::mpsc;

use super::api_service::ApiService;
use crate::{
    api::{command::Reply, model::ErrorCode, views::ApiError},
    ipam::{
        holds::Holds,
        records::Records,
        releaser::Urgent,
        store::{ReleaseFile, ReleaseStore, StoreRequest},
    },
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
    /// The thread that writes held releases, off this loop; none before the agent serves.
    store: Option<ReleaseStore>,
    /// Where released allocations are stored (`state_dir/ipam-releases`).
    release_dir: std::path::PathBuf,
}

impl IpamSide {
    pub(super) fn new(state_dir: &std::path::Path, capacity: usize) -> Self {
        Self {
            holds: Holds::default(),
            records: Records::new(paths::ipam_allocation_dir(state_dir), capacity),
            urgent: None,
            store: None,
            release_dir: paths::ipam_release_dir(state_dir),
        }
    }

    /// The releaser's queue for pool pressure.
    pub(super) fn set_releaser(&mut self, urgent: mpsc::Sender<Urgent>) {
        self.urgent = Some(urgent);
    }

    /// The thread that writes held releases.
    pub(super) fn set_store(&mut self, store: ReleaseStore) {
        self.store = Some(store);
    }

    /// The releaser's queue, when one runs.
    pub(super) fn urgent(&self) -> Option<&mpsc::Sender<Urgent>> {
        self.urgent.as_ref()
    }

    /// Checks a release and hands it to the store's thread, which writes it durably under
    /// `state_dir/ipam-releases`, stamped with the agent's own time (what "never early" counts
    /// from), and only then answers `reply`: nothing here waits on the disk. What it runs is
    /// its allocation's record, never the request: a request naming another delegate, or an
    /// address the allocation did not get, is refused (409) here and nothing stored. A release
    /// with no record (an allocation an older ipq-ipam made) is taken as
    /// [`unrecorded`](unrecorded). Its addresses are completed with what the registry has for
    /// its attachment (at ipq-ipam's DEL the holder still lives, so a DEL without prevResult
    /// still names them). O(k) on this loop.
    pub(super) fn hold_release(
        &self,
        release: HeldRelease,
        reply: Reply<HeldRelease>,
        api: &ApiService<'_>,
        metrics: &Metrics,
    ) {
        let checked = self.check_release(release, api, metrics);
        match (checked, &self.store) {
            (Ok((release, file)), Some(store)) => store.store(StoreRequest {
                release,
                file,
                reply,
            }),
            (Ok(_), None) => {
                let _ = reply.send(Err(ApiError::new(
                    ErrorCode::Unavailable,
                    "the agent is starting: nothing stored; retry later",
                )));
            }
            (Err(e), _) => {
                let _ = reply.send(Err(e));
            }
        }
    }

    /// The release to store for `release` and its file, or why none is (409).
    fn check_release(
        &self,
        release: HeldRelease,
        api: &ApiService<'_>,
        metrics: &Metrics,
    ) -> Result<(HeldRelease, ReleaseFile), ApiError> {
        let record = self.records.get(
            release.network.as_deref(),
            &release.container_id,
            &release.ifname,
        );
        let known: BTreeSet<IpAddr> = api
            .attachment_addresses(&release.container_id, &release.ifname)
            .collect();
        // A recorded allocation's release has one file, named after the record: a runtime
        // repeating its DEL gets the release stored first (the store's thread looks).
        let file = match &record {
            Some(r) => ReleaseFile::Recorded(self.release_dir.join(release_file_name(r))),
            None => ReleaseFile::New,
        };
        let mut release = match &record {
            Some(record) => recorded(&release, record)?,
            None => unrecorded(release, &known, api, metrics)?,
        };
        let all: BTreeSet<IpAddr> = release.addresses.iter().copied().chain(known).collect();
        release.addresses = all.into_iter().collect();
        Ok((release, file))
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

fn listed<'a>(addresses: impl Iterator<Item = &'a IpAddr>) -> String {
    let all: Vec<String> = addresses.map(ToString::to_string).collect();
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.join(", ")
    }
}
