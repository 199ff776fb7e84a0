//! This node's quarantine, published in the Kubernetes API as its `NodeQuarantine` object
//! (cluster-scoped, `ipq.dev/v1alpha1`, named after the node and owned by its Node; the CRD is
//! deploy/kubernetes/05-nodequarantine-crd.yaml, the reader's side docs/kubernetes.md).
//!
//! The owner loop only hands over what changed: one batch of [`Change`]s per pass (one per
//! changed address) on a channel bounded to [`FEED_BATCHES`] ([`Feed::send_with`], O(1) to
//! refuse). When the writer is that far behind (a write hanging on a slow API server while
//! changes pour in), the pass's changes stay in the registry, coalesced per address, counted
//! (`ipq_publish_feed_full_total`), and are offered again on a later pass (one runs at least
//! once a second): the queue never grows past the bound, and no change is lost (what is sent
//! later is the address's entry as it is then). The writer task keeps its own map of the listed
//! addresses, and writes the whole status by server-side apply on the status subresource
//! (field manager `ipq-agent`), coalesced: the first change after a quiet spell at once, then
//! at most one write per [`Timing::min_interval`], whatever the churn. A write that fails is
//! counted (`ipq_publish_failures_total`), shown in `ipq status`, and retried with backoff
//! carrying everything that changed meanwhile; enforcement never waits for it.
//!
//! With no node name (neither `kubernetes.node_name` nor `NODE_NAME`) the agent starts no
//! publisher and makes no client: nothing is attempted.

pub mod api_health;
mod backoff;
mod client;
pub mod cluster;
mod entry;
mod kube_sink;
mod metrics;
pub mod whereabouts;
pub mod writer;

use std::{
    future::Future,
    net::IpAddr,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use ipq_api::PublishState;
use tokio::sync::{mpsc, watch};

pub use api_health::ApiHealth;
pub use backoff::Backoff;
pub use client::CachedClient;
pub use entry::{status_body, EntryState, Orphans, PublishedEntry};
pub use kube_sink::{
    pod_present, KubeSink, FIELD_MANAGER, GROUP, KIND, PLURAL, REQUEST_TIMEOUT, VERSION,
};
pub use metrics::{FailureReason, PublishMetrics};
pub use writer::{run, Sink, Timing, WriteError};

/// A client of the API server as the publisher makes one (its timeouts, its kubeconfig or the
/// pod's service account), for the agent's other writers (pod Events).
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, WriteError> {
    kube_sink::client_for(kubeconfig, kube_sink::REQUEST_TIMEOUT).await
}

/// A client error as the publisher classifies it (`refused` for an answer, else `unreachable`).
pub fn kube_failure(what: &str, e: kube::Error) -> WriteError {
    kube_sink::failure(what, e)
}

use crate::{api::model::PublishView, config::KubernetesConfig};

/// The environment variable the DaemonSet sets to the node's name (downward API).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// What the publisher needs from the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub node: String,
    pub kubeconfig: Option<PathBuf>,
}

impl Settings {
    /// `None` when no node name is configured: the agent then publishes nothing.
    pub fn from_config(config: &KubernetesConfig) -> Option<Self> {
        let node = config.node_name.clone().or_else(|| {
            std::env::var(NODE_NAME_ENV)
                .ok()
                .filter(|name| !name.is_empty())
        })?;
        Some(Self {
            node,
            kubeconfig: config.kubeconfig.clone(),
        })
    }
}

/// One address's entry as it is now; `None`: the object no longer lists it.
#[derive(Debug)]
pub struct Change {
    pub addr: IpAddr,
    pub entry: Option<PublishedEntry>,
}

/// Batches handed over and not yet taken by the writer, at most. The owner loop makes one per
/// pass, and the writer takes every waiting one whenever it is not inside a write: only a write
/// that hangs (up to the client's timeout) while the loop keeps passing fills it.
pub const FEED_BATCHES: usize = 64;

/// The owner loop's end of the publisher.
pub struct Feed {
    changes: mpsc::Sender<Vec<Change>>,
    /// The whereabouts projection's orphaned holders, whole (it alone learns of them).
    orphans: watch::Sender<Orphans>,
    view: Arc<Mutex<PublishView>>,
    metrics: Arc<PublishMetrics>,
    /// The writer, until [`Feed::launch`] spawns it.
    writer: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The API server's prober, spawned with the writer (none in tests of the writer alone).
    prober: Option<(ApiHealth, Option<PathBuf>)>,
}

impl Feed {
    /// Hands over the batch `take` makes, when the writer has room for one more; never waits.
    /// When it has not ([`FEED_BATCHES`] wait), `take` is not called, the refusal is counted
    /// (`ipq_publish_feed_full_total`) and `false` returned: the caller keeps its changes and
    /// offers them again later.
    pub fn send_with(&self, take: impl FnOnce() -> Vec<Change>) -> bool {
        match self.changes.try_reserve() {
            Ok(permit) => {
                let batch = take();
                if !batch.is_empty() {
                    permit.send(batch);
                }
                true
            }
            Err(mpsc::error::TrySendError::Full(())) => {
                self.metrics.feed_full.inc();
                false
            }
            // A writer that stopped (it does not, short of a panic) leaves the view saying so;
            // keeping changes for it would only grow.
            Err(mpsc::error::TrySendError::Closed(())) => true,
        }
    }

    /// One changed address as a batch of its own; `false` when the feed is full.
    pub fn send(&self, addr: IpAddr, entry: Option<PublishedEntry>) -> bool {
        self.send_with(|| vec![Change { addr, entry }])
    }

    /// Spawns the writer on the current runtime. Called once the registry's whole state has
    /// been sent: the writer's first write must not be an empty list (that would tell every
    /// reader, for a moment, that a restarted node has nothing in quarantine).
    pub fn launch(&mut self) {
        if let Some(writer) = self.writer.take() {
            tokio::spawn(writer);
        }
        if let Some((health, kubeconfig)) = self.prober.take() {
            health.spawn_prober(kubeconfig);
        }
    }

    /// Where the whereabouts projection hands over its orphaned holders (each a force-deleted
    /// pod still running), whole, whenever they change.
    pub fn orphans(&self) -> watch::Sender<Orphans> {
        self.orphans.clone()
    }

    /// How publishing stands, for `ipq status`.
    pub fn view(&self) -> PublishView {
        lock(&self.view).clone()
    }
}

/// The publisher, writing through `sink` once [`Feed::launch`]ed.
pub fn start_with<S: Sink + Send + 'static>(
    node: String,
    sink: S,
    timing: Timing,
    metrics: Arc<PublishMetrics>,
    health: ApiHealth,
) -> Feed {
    let (changes, received) = mpsc::channel(FEED_BATCHES);
    let (orphans, orphans_received) = watch::channel(Orphans::default());
    let view = Arc::new(Mutex::new(PublishView {
        node: node.clone(),
        state: PublishState::Starting,
        ..PublishView::default()
    }));
    let writer = run(
        node,
        sink,
        writer::Inputs {
            changes: received,
            orphans: orphans_received,
        },
        timing,
        view.clone(),
        metrics.clone(),
        health,
    );
    Feed {
        changes,
        orphans,
        view,
        metrics,
        writer: Some(Box::pin(writer)),
        prober: None,
    }
}

/// The publisher to the API server `settings` name, once [`Feed::launch`]ed; `health` is
/// shared with the whereabouts projection (its prober is the caller's to spawn).
pub fn start(settings: Settings, metrics: Arc<PublishMetrics>, health: ApiHealth) -> Feed {
    let sink = KubeSink::new(settings.node.clone(), settings.kubeconfig.clone());
    let mut feed = start_with(
        settings.node,
        sink,
        Timing::default(),
        metrics,
        health.clone(),
    );
    feed.prober = Some((health, settings.kubeconfig));
    feed
}

fn lock(view: &Mutex<PublishView>) -> std::sync::MutexGuard<'_, PublishView> {
    view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The cap on listed entries: an entry is about 250 bytes of JSON, and the API server refuses
/// objects over 1.5 MiB (etcd's request limit).
pub const MAX_ENTRIES: usize = 4096;

/// How long a publisher waits between writes at least, and how it backs off.
impl Default for Timing {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_millis(250),
            first_retry: Duration::from_millis(500),
            max_retry: Duration::from_secs(30),
            max_entries: MAX_ENTRIES,
            orphans_retry: Duration::from_secs(600),
        }
    }
}

#[cfg(test)]
mod tests;
