//! The owner's part in the agent's start-up, after recovery: every configured interface
//! attached once before stale pins are pruned, then the parts that act on the node's changes
//! (reuse hygiene, the IPAM releaser's queue, the publisher) started and the attach workers
//! let move interfaces to TCX.

use tokio::sync::mpsc;

use super::Tracker;
use crate::{
    api::model::StartedView,
    datapath::attach::JobReport,
    hygiene::{self, HygieneError},
    ipam::{holds::Holds, records::Records, releaser::Urgent, store::ReleaseStore},
    publish::{whereabouts, Feed},
};

/// What serving needs the owner to know: the IPAM releaser's queue for pool pressure and,
/// when the agent publishes, the NodeQuarantine publisher's and the whereabouts projection's
/// ends.
pub struct ServeWith {
    pub urgent: mpsc::Sender<Urgent>,
    pub publish: Option<(
        Feed,
        Option<whereabouts::Feed>,
        crate::publish::cluster::ClusterReader,
    )>,
    /// The pod Events' writer, when the agent writes them.
    pub pod_events: Option<crate::pod_events::Feed>,
    /// Where remote claims' local holders are asked about, when the agent knows its node.
    pub remote_claims: Option<crate::remote_claim::Asker>,
}

/// What serving gives the rest of the agent.
pub struct Served {
    /// Reuse hygiene's reports, for the owner loop.
    pub hygiene_reports: mpsc::Receiver<hygiene::Report>,
    /// ipq-ipam's holds and the records of its allocations, for the releaser and the API.
    pub ipam_holds: Holds,
    pub ipam_records: Records,
    /// What was in place when the agent became ready.
    pub started: StartedView,
    /// The addresses the registry holds.
    pub addresses: usize,
}

impl Tracker {
    /// Takes the attach workers' reports until every configured interface was attached (or
    /// failed) once, then detaches what earlier agents attached and no configured interface
    /// needs now: the pins of an interface still being attached are its enforcement until its
    /// new program is in.
    pub async fn first_attach(&mut self, reports: &mut mpsc::Receiver<JobReport>) {
        while self.protection.attacher.ledger().attaching() {
            match reports.recv().await {
                Some(report) => self.protection.on_report(report, &mut self.sinks.observer),
                None => break,
            }
        }
        self.protection.prune_links();
    }

    /// Start-up is done: reuse hygiene starts (after recovery and the first reconcile: from
    /// here on a holder gone or new is a change on the node, and its address is cleaned); the
    /// releaser's queue is taken (only now is "free" the truth); the publisher starts, its
    /// first write the node's truth; what is in place is recorded for `/v1/status`; and the
    /// attach workers may move netlink-protected interfaces to TCX (only now: a TCX link create
    /// holds rtnl_lock for a grace period, and start-up's netlink requests would wait behind
    /// every one).
    pub fn serve(&mut self, with: ServeWith) -> Result<Served, HygieneError> {
        let hygiene_reports = self.sinks.start_hygiene(&self.core.config, &self.metrics)?;
        self.ipam.set_releaser(with.urgent);
        if let Some(mut events) = with.pod_events {
            events.launch();
            self.sinks.observer.set_pod_events(events);
        }
        self.sinks.remote_claims = with.remote_claims;
        if let Some((feed, projection, cluster)) = with.publish {
            self.publishing
                .start(&mut self.core.registry, feed, projection, Some(cluster));
        }
        Ok(Served {
            hygiene_reports,
            ipam_holds: self.ipam.holds(),
            ipam_records: self.ipam.records(),
            started: self.protection.mark_started(),
            addresses: self.core.registry.records().len(),
        })
    }

    /// ipq-ipam's held releases are written by `store`'s thread from now on (started once
    /// serving gave it the holds to keep).
    pub fn store_releases_with(&mut self, store: ReleaseStore) {
        self.ipam.set_store(store);
    }
}
