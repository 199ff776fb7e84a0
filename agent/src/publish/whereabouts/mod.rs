//! The quarantine projected into whereabouts (`kubernetes.whereabouts = true`; off by default;
//! docs/kubernetes.md): for each address this node's NodeQuarantine lists, an
//! `OverlappingRangeIPReservation` (whereabouts.cni.cncf.io/v1alpha1) named as whereabouts
//! names the address's reservation, in whereabouts' namespace. whereabouts' allocation skips an
//! address whose reservation names another pod (pkg/storage/kubernetes/ipam.go, v0.9), so the
//! next pod is given another address until the quarantine ends.
//!
//! Each reservation names a podRef no pod can have (`ipq.dev:quarantine/<node>`), carries the
//! label `ipq.dev/node=<node>` and the address in an annotation, and is owned by the node's
//! NodeQuarantine, so it is collected with it (and with the Node). whereabouts deletes
//! reservations by name on a CNI DEL and on a Pod's DELETE (its control loop), and its
//! reconciler deletes those whose podRef is no live pod: ipq watches its own (by the label) and
//! makes again at once any that goes while the address is still listed. When the departed
//! holder's own reservation is still there, ipq takes it over in place (a replace, refused if
//! it changed meanwhile) rather than waiting for whereabouts to delete it. A reservation naming
//! any other pod is never touched: it already keeps the address from the next pod. ipq deletes
//! its own, by uid, when the address leaves the list.
//!
//! Writes are coalesced like the NodeQuarantine's: one round of calls at most every
//! `min_interval`, an address that comes and goes within it costing none; failures are counted
//! (`ipq_publish_whereabouts_failures_total`), logged at most once a minute per reason, and
//! retried with backoff. Enforcement never waits for any of it.

mod kube_store;
mod metrics;
mod projection;

use std::{
    future::Future,
    net::IpAddr,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use log::{debug, info, warn};
use tokio::{sync::mpsc, time::Instant};

pub use kube_store::{
    node_label_value, quarantine_pod_ref, KubeStore, ADDRESS_ANNOTATION, NODE_LABEL,
};
pub use metrics::ProjectionMetrics;
pub use projection::{reservation_name, Op, Projection};

use super::{Change, PublishedEntry, Timing, WriteError};
use crate::metrics::Metrics;

/// The namespace whereabouts keeps its objects in when installed from its manifests.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// How soon an address whose reservation names another pod is looked at again: that pod's
/// reservation goes when whereabouts frees the address, and ipq's must follow at once.
pub const FOREIGN_RECHECK: Duration = Duration::from_millis(500);
/// How often a failure that keeps happening is logged (every one is counted).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Where the reservations go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    /// whereabouts' namespace (its kubeconfig's context; `WHEREABOUTS_NAMESPACE`).
    pub namespace: String,
    /// The `network_name` of the whereabouts IPAM config (empty: the unnamed network).
    pub network_name: String,
}

/// What a create found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Created {
    /// Made, of this uid.
    Made(String),
    /// Already ipq's (an earlier run's), of this uid.
    Found(String),
    /// The departed holder's own, taken over; of this uid.
    Adopted(String),
    /// Another pod's: left alone.
    Foreign,
}

/// What the store saw happen to ipq's reservations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// The reservation of this uid was deleted.
    Deleted(String),
    /// The watch ended: what is held is to be listed again.
    Lost,
}

/// The API server, or a test's double.
pub trait Store {
    /// Lists ipq's reservations (address and uid) and starts watching them.
    fn sync(&mut self) -> impl Future<Output = Result<Vec<(IpAddr, String)>, WriteError>> + Send;
    fn create(
        &mut self,
        addr: IpAddr,
        holder_pod_ref: Option<&str>,
    ) -> impl Future<Output = Result<Created, WriteError>> + Send;
    /// Deletes `addr`'s reservation if it is still the one of `uid` (else leaves it).
    fn delete(
        &mut self,
        addr: IpAddr,
        uid: &str,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// The next thing seen; cancel-safe.
    fn event(&mut self) -> impl Future<Output = StoreEvent> + Send;
}

/// The owner loop's end of the projection.
pub struct Feed {
    changes: mpsc::UnboundedSender<Change>,
    task: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Feed {
    /// Hands one changed address over; O(1), never waits.
    pub fn send(&self, addr: IpAddr, entry: Option<PublishedEntry>) {
        let _ = self.changes.send(Change { addr, entry });
    }

    /// Spawns the task, once the registry's whole state has been sent: its first round must
    /// know every listed address, or it would delete the reservations a previous run made.
    pub fn launch(&mut self) {
        if let Some(task) = self.task.take() {
            tokio::spawn(task);
        }
    }
}

/// The projection through `store`, once [`Feed::launch`]ed.
pub fn start_with<S: Store + Send + 'static>(
    store: S,
    timing: Timing,
    metrics: Arc<Metrics>,
) -> Feed {
    let (changes, received) = mpsc::unbounded_channel();
    Feed {
        changes,
        task: Some(Box::pin(run(store, received, timing, metrics))),
    }
}

/// The projection to the API server of `kubeconfig`.
pub fn start(target: Target, kubeconfig: Option<PathBuf>, metrics: Arc<Metrics>) -> Feed {
    start_with(
        KubeStore::new(target, kubeconfig),
        Timing::default(),
        metrics,
    )
}

struct Task<S> {
    store: S,
    projection: Projection,
    timing: Timing,
    synced: bool,
    next_round: Instant,
    retry_delay: Duration,
    foreign_recheck_at: Option<Instant>,
    failing_since: Option<SystemTime>,
    last_logged: Option<(Instant, String)>,
    metrics: Arc<Metrics>,
}

/// Runs until the owner's end of the channel is dropped.
pub async fn run<S: Store>(
    store: S,
    mut changes: mpsc::UnboundedReceiver<Change>,
    timing: Timing,
    metrics: Arc<Metrics>,
) {
    let mut task = Task {
        store,
        projection: Projection::default(),
        timing,
        synced: false,
        next_round: Instant::now(),
        retry_delay: timing.first_retry,
        foreign_recheck_at: None,
        failing_since: None,
        last_logged: None,
        metrics,
    };
    loop {
        let due = (!task.synced || task.projection.has_work()).then_some(task.next_round);
        tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { break };
                task.projection.want(change.addr, change.entry.as_ref());
                while let Ok(change) = changes.try_recv() {
                    task.projection.want(change.addr, change.entry.as_ref());
                }
            }
            event = task.store.event() => task.saw(event),
            () = sleep_until(due), if due.is_some() => {
                while let Ok(change) = changes.try_recv() {
                    task.projection.want(change.addr, change.entry.as_ref());
                }
                task.round().await;
            }
            () = sleep_until(task.foreign_recheck_at), if task.foreign_recheck_at.is_some() => {
                task.foreign_recheck_at = None;
                task.projection.recheck_foreign();
            }
        }
        let m = &task.metrics.whereabouts;
        m.reservations.set(task.projection.held_count() as i64);
        m.foreign.set(task.projection.foreign_count() as i64);
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

impl<S: Store> Task<S> {
    fn saw(&mut self, event: StoreEvent) {
        match event {
            StoreEvent::Deleted(uid) => {
                if let Some(addr) = self.projection.deleted(&uid) {
                    debug!("whereabouts reservation of {addr} deleted by someone else: made again");
                    self.metrics.whereabouts.recreated.inc();
                    // At once: the address has no reservation now.
                    self.next_round = Instant::now();
                }
            }
            StoreEvent::Lost => self.synced = false,
        }
    }

    /// Lists if needed, then makes every call due; stops at the first failure (the API server
    /// is likely down for the rest too) and backs off.
    async fn round(&mut self) {
        let outcome = self.calls().await;
        let now = Instant::now();
        match outcome {
            Ok(()) => {
                self.next_round = now + self.timing.min_interval;
                self.retry_delay = self.timing.first_retry;
                if let Some(since) = self.failing_since.take() {
                    let for_s = SystemTime::now()
                        .duration_since(since)
                        .unwrap_or_default()
                        .as_secs_f64();
                    info!("whereabouts reservations: written again after {for_s:.1}s of failures");
                }
                self.last_logged = None;
            }
            Err(e) => {
                self.metrics.whereabouts.failed(e.reason);
                self.failing_since.get_or_insert_with(SystemTime::now);
                self.next_round = now + self.retry_delay;
                self.log_failure(&e);
                self.retry_delay = (self.retry_delay * 2).min(self.timing.max_retry);
            }
        }
        if self.projection.foreign_count() > 0 && self.foreign_recheck_at.is_none() {
            self.foreign_recheck_at = Some(now + FOREIGN_RECHECK);
        }
    }

    async fn calls(&mut self) -> Result<(), WriteError> {
        if !self.synced {
            let held = self.store.sync().await?;
            info!(
                "whereabouts reservations: {} of this node's found, watching them",
                held.len()
            );
            self.projection.relisted(held);
            self.synced = true;
        }
        let mut ops = self.projection.take_ops().into_iter();
        while let Some(op) = ops.next() {
            if let Err(e) = self.call(&op).await {
                for left in std::iter::once(op).chain(ops) {
                    self.projection.failed(op_addr(&left));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    async fn call(&mut self, op: &Op) -> Result<(), WriteError> {
        let m = &self.metrics.whereabouts;
        match op {
            Op::Create {
                addr,
                holder_pod_ref,
            } => match self.store.create(*addr, holder_pod_ref.as_deref()).await? {
                Created::Made(uid) | Created::Adopted(uid) => {
                    m.writes.inc();
                    self.projection.held(*addr, uid);
                }
                Created::Found(uid) => self.projection.held(*addr, uid),
                Created::Foreign => self.projection.held_by_another(*addr),
            },
            Op::Delete { addr, uid } => {
                self.store.delete(*addr, uid).await?;
                m.writes.inc();
                self.projection.released(*addr);
            }
        }
        Ok(())
    }

    fn log_failure(&mut self, e: &WriteError) {
        let text = e.to_string();
        let due = self
            .last_logged
            .as_ref()
            .is_none_or(|(at, last)| *last != text || at.elapsed() >= FAILURE_LOG_EVERY);
        if due {
            warn!(
                "whereabouts reservations: write failed ({}): {text}; retrying in {:?} \
                 (enforcement on this node is not affected)",
                <&str>::from(e.reason),
                self.retry_delay
            );
            self.last_logged = Some((Instant::now(), text));
        }
    }
}

fn op_addr(op: &Op) -> IpAddr {
    match op {
        Op::Create { addr, .. } | Op::Delete { addr, .. } => *addr,
    }
}

#[cfg(test)]
mod tests;
