//! Asking the API server about a remote claim's local holder before it is fenced.
//!
//! Under `fence-old` another machine's announcement of an address an Active pod here holds
//! fences that pod: the cluster IPAM gave the address to another node's pod, so the local one
//! is stale (whereabouts frees a force-deleted pod's address while its container still runs).
//! But an announcement is a packet anyone on the uplink's L2 can forge, and one forged GARP
//! would cut off a live pod for as long as it lives. The cluster knows better: the IPAM frees
//! a pod's address when the Pod object goes (whereabouts on the Pod's DELETE), so while the
//! holder's pod (same name, same uid) is still in the API server, the address is still its
//! own and the announcement is a double allocation or a forgery: reported, not fenced. Gone,
//! it is fenced. No answer within [`ANSWER_WITHIN`] (API server down, RBAC refused) falls back
//! to the announcement's word, as on a node without Kubernetes: counted and logged.
//!
//! The owner loop hands a question over with one `try_send` ([`Asker::ask`]); the task here
//! asks (one `get` of the pod's metadata, retried with the shared backoff) and sends the
//! answer back to the loop, which decides ([`Lifecycle::remote_claim_answered`]). A pod found
//! present is not asked about again for [`PRESENT_FOR`]: a flood of forged announcements costs
//! the API server one request per pod per that interval, and the bounded queue drops (counted)
//! what the task cannot take.
//!
//! [`Lifecycle::remote_claim_answered`]: crate::registry::Lifecycle::remote_claim_answered

mod ask;
mod metrics;

use std::{net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use ask::{run, KubePods, PodLookup};
pub use metrics::RemoteClaimMetrics;

use crate::registry::{Holder, PodStanding};

/// Questions handed over and not yet taken, at most.
pub const QUEUE: usize = 256;
/// How long a question may wait for the API server before the announcement is taken at its
/// word: the stale holder of a real early reuse answers for the new holder's address meanwhile.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// How long a pod found present is taken to stay so.
pub const PRESENT_FOR: Duration = Duration::from_secs(10);

/// One question: is `holder`'s pod (it holds `addr` here) still in the API server?
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    pub addr: IpAddr,
    pub holder: Holder,
}

/// The answer, for the owner loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub addr: IpAddr,
    pub holder: Holder,
    pub standing: PodStanding,
}

/// The owner loop's end.
pub struct Asker {
    questions: mpsc::Sender<Question>,
    metrics: Arc<RemoteClaimMetrics>,
}

impl Asker {
    /// Hands the question over; never waits. A full queue drops it, counted: the claim, still
    /// made, is sampled and asked about again.
    pub fn ask(&self, addr: IpAddr, holder: Holder) {
        match self.questions.try_send(Question { addr, holder }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.metrics.dropped.inc(),
            // The task ended (it does not, short of a panic): the answers' queue closes too.
            Err(mpsc::error::TrySendError::Closed(_)) => self.metrics.dropped.inc(),
        }
    }
}

/// Where the pods are looked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub kubeconfig: Option<PathBuf>,
}

/// Starts asking through `lookup` on the current runtime: the loop's end and the answers.
pub fn start_with<L: PodLookup + Send + 'static>(
    lookup: L,
    metrics: Arc<RemoteClaimMetrics>,
) -> (Asker, mpsc::Receiver<Answer>) {
    let (questions, asked) = mpsc::channel(QUEUE);
    let (answers, answered) = mpsc::channel(QUEUE);
    tokio::spawn(run(lookup, asked, answers, metrics.clone()));
    (Asker { questions, metrics }, answered)
}

/// Starts asking the API server `settings` name.
pub fn start(
    settings: Settings,
    metrics: Arc<RemoteClaimMetrics>,
) -> (Asker, mpsc::Receiver<Answer>) {
    start_with(KubePods::new(settings.kubeconfig), metrics)
}

#[cfg(test)]
mod tests;
