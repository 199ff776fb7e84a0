//! The quarantine projected into whereabouts (`kubernetes.whereabouts = true`; off by default;
//! docs/kubernetes.md). whereabouts' allocation skips an address whose
//! `OverlappingRangeIPReservation` (whereabouts.cni.cncf.io/v1alpha1, named after the address:
//! [`reservation_name`]) names another pod (pkg/storage/kubernetes/ipam.go, v0.9); it deletes
//! that reservation by name when it frees the address: on the CNI DEL, on the Pod's DELETE (its
//! control loop, even while a force-deleted pod's container still runs), and in its reconciler
//! (whose podRef is no live pod).
//!
//! So ipq keeps a reservation for every address that must not be handed out: one the
//! NodeQuarantine lists, and one whose reservation whereabouts deleted while its holder still
//! runs on this node. It watches (by the label `ipq.dev/node=<node>`, one watch per node):
//! - whereabouts' own reservation of each live pod's address on this node, labelled (a metadata
//!   patch: its spec stays whereabouts'), so that its deletion is seen at once;
//! - its own reservations, which name a podRef no pod can have (`ipq.dev:quarantine/<node>`),
//!   carry the address in an annotation, and are owned by the node's NodeQuarantine (so they are
//!   collected with it, and with the Node).
//!
//! A watched reservation deleted while its address is still wanted is made again at once as
//! ipq's own. Nothing it must keep lives only in memory: ipq's own names the holder it was
//! made for (`ipq.dev/holder`) and a restarted agent keeps it while its registry has that holder
//! live; a live holder's reservation found missing with its pod gone from the API (a force
//! delete while no agent ran) is made as ipq's own. A reservation naming another pod is never touched: it already keeps the address
//! from the next pod. ipq deletes its own, by uid, when its address is wanted no more (the
//! quarantine ended).
//!
//! Writes are coalesced like the NodeQuarantine's: one round of calls at most every
//! `min_interval`, an address that comes and goes within it costing none; failures are counted
//! (`ipq_publish_whereabouts_failures_total`), logged at most once a minute per reason, and
//! retried with backoff. Enforcement never waits for any of it.

mod kube_store;
mod metrics;
mod projection;
mod watch;

use std::{
    future::Future,
    net::IpAddr,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use log::{debug, info, warn};
use tokio::{
    sync::{mpsc, watch as latest},
    time::Instant,
};

pub use kube_store::{
    node_label_value, quarantine_pod_ref, KubeStore, ADDRESS_ANNOTATION, NODE_LABEL,
};
pub use metrics::ProjectionMetrics;
pub use projection::{pod_ref, reservation_name, Hold, Op, Projection, Want};

use super::{
    api_health::{ApiHealth, RETURN_SPREAD},
    Backoff, FailureReason, Orphans, Timing, WriteError,
};
use crate::api::model::WhereaboutsView;

/// The namespace whereabouts keeps its objects in when installed from its manifests.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
/// How soon an address whose reservation names another pod is looked at again: that pod's
/// reservation goes when whereabouts frees the address, and ipq's must follow at once.
pub const FOREIGN_RECHECK: Duration = Duration::from_millis(500);
/// How often a failure that keeps happening is logged (every one is counted).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// The metrics the projection writes: its own (`ipq_publish_whereabouts_*`), and the feed's
/// refusals it shares with the NodeQuarantine writer (`ipq_publish_feed_full_total`).
#[derive(Clone)]
pub struct TaskMetrics {
    pub projection: Arc<ProjectionMetrics>,
    pub feed_full: prometheus::IntCounter,
}

/// Where the reservations go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub node: String,
    /// whereabouts' namespace (its kubeconfig's context; `WHEREABOUTS_NAMESPACE`).
    pub namespace: String,
    /// The `network_name` of the whereabouts IPAM config (empty: the unnamed network).
    pub network_name: String,
}

/// What a reserve or a watch found, or did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// ipq's own made, of this uid (for a watch: the pod was gone and its reservation too).
    Made(String),
    /// The pod's own (whereabouts') labelled, of this uid.
    Labelled(String),
    /// Watched by ipq already (an earlier run's).
    AlreadyHeld(Hold),
    /// Another pod's (or, for a watch, none): left alone.
    NotHeld,
}

/// What the store saw happen to ipq's reservations.
#[derive(Debug)]
pub enum StoreEvent {
    /// Every reservation ipq watches, as a complete list found them: the first, or a new one
    /// after the watch expired (410 Gone) or was started again. It replaces what was held.
    Listed(Vec<(IpAddr, Hold)>),
    /// The reservation of this uid was deleted.
    Deleted(String),
    /// The watch failed; the store retries it with backoff (and lists again if it must).
    Failed(WriteError),
}

/// The API server, or a test's double.
pub trait Store {
    /// Starts listing and watching the reservations ipq watches: a [`StoreEvent::Listed`]
    /// first, then what changes, for as long as the store lives.
    fn follow(&mut self);
    /// [`Op::Reserve`]: makes ipq's own, or labels `pod_ref`'s own if it is there.
    fn reserve(
        &mut self,
        addr: IpAddr,
        pod_ref: Option<&str>,
    ) -> impl Future<Output = Result<Reserved, WriteError>> + Send;
    /// [`Op::Watch`]: labels `pod_ref`'s own if it is there; if it is not and that pod (of
    /// `pod_uid`, when known) is gone from the API, makes ipq's own for it.
    fn watch(
        &mut self,
        addr: IpAddr,
        pod_ref: &str,
        pod_uid: Option<&str>,
    ) -> impl Future<Output = Result<Reserved, WriteError>> + Send;
    /// Deletes `addr`'s reservation if it is still the one of `uid` (else leaves it).
    fn delete(
        &mut self,
        addr: IpAddr,
        uid: &str,
    ) -> impl Future<Output = Result<(), WriteError>> + Send;
    /// The next thing seen; cancel-safe.
    fn event(&mut self) -> impl Future<Output = StoreEvent> + Send;
}

/// One address as the registry now has it.
#[derive(Debug)]
pub struct Change {
    pub addr: IpAddr,
    pub want: Option<Want>,
}

/// The owner loop's end of the projection: batches of changed addresses on a channel bounded
/// like the NodeQuarantine writer's ([`crate::publish::FEED_BATCHES`]); the owner takes a
/// batch out of the registry only when both have room (`Tracker::publish_changes`).
pub struct Feed {
    changes: mpsc::Sender<Vec<Change>>,
    /// `ipq_publish_feed_full_total`.
    full: prometheus::IntCounter,
    view: Arc<Mutex<WhereaboutsView>>,
    task: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Feed {
    /// Whether a batch can be handed over now; counted when it cannot (the changes then stay
    /// in the registry, coalesced, for a later pass).
    pub fn has_room(&self) -> bool {
        let room = self.changes.capacity() > 0 || self.changes.is_closed();
        if !room {
            self.full.inc();
        }
        room
    }

    /// Hands a batch of changed addresses over; never waits (the owner loop asked
    /// [`Self::has_room`] first and is the only sender).
    pub fn send_batch(&self, batch: Vec<Change>) {
        if !batch.is_empty() {
            let _ = self.changes.try_send(batch);
        }
    }

    /// Hands one changed address over; O(1), never waits.
    pub fn send(&self, addr: IpAddr, want: Option<Want>) {
        self.send_batch(vec![Change { addr, want }]);
    }

    /// How the projection stands, for `ipq status`.
    pub fn view(&self) -> WhereaboutsView {
        lock(&self.view).clone()
    }

    /// Spawns the task, once the registry's whole state has been sent: its first round must
    /// know every listed address, or it would delete the reservations a previous run made.
    pub fn launch(&mut self) {
        if let Some(task) = self.task.take() {
            tokio::spawn(task);
        }
    }
}

fn lock(view: &Mutex<WhereaboutsView>) -> std::sync::MutexGuard<'_, WhereaboutsView> {
    view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The projection through `store` into `target`, once [`Feed::launch`]ed. The live holders it
/// finds orphaned (their pod's reservation freed under them) go to `orphans`, the
/// NodeQuarantine writer's.
pub fn start_with<S: Store + Send + 'static>(
    store: S,
    target: &Target,
    timing: Timing,
    metrics: TaskMetrics,
    health: ApiHealth,
    orphans: latest::Sender<Orphans>,
) -> Feed {
    let (changes, received) = mpsc::channel(crate::publish::FEED_BATCHES);
    let view = Arc::new(Mutex::new(WhereaboutsView {
        namespace: target.namespace.clone(),
        network_name: target.network_name.clone(),
        ..WhereaboutsView::default()
    }));
    Feed {
        changes,
        full: metrics.feed_full.clone(),
        view: view.clone(),
        task: Some(Box::pin(run(
            store, received, timing, view, metrics, health, orphans,
        ))),
    }
}

/// The projection to the API server of `kubeconfig`; `health` is the NodeQuarantine
/// writer's (whose feed probes the API server).
pub fn start(
    target: Target,
    kubeconfig: Option<PathBuf>,
    metrics: TaskMetrics,
    health: ApiHealth,
    orphans: latest::Sender<Orphans>,
) -> Feed {
    start_with(
        KubeStore::new(target.clone(), kubeconfig, health.clone()),
        &target,
        Timing::default(),
        metrics,
        health,
        orphans,
    )
}

struct Task<S> {
    store: S,
    projection: Projection,
    timing: Timing,
    /// Whether the watch's first complete list came: no call before it (a previous run's
    /// reservations would look unheld, and be made again or deleted).
    synced: bool,
    next_round: Instant,
    backoff: Backoff,
    /// Whether the last round failed (its next one waits on the backoff).
    failing: bool,
    health: ApiHealth,
    foreign_recheck_at: Option<Instant>,
    failing_since: Option<SystemTime>,
    last_logged: Option<(Instant, String)>,
    view: Arc<Mutex<WhereaboutsView>>,
    metrics: TaskMetrics,
    /// The NodeQuarantine writer's end for the orphans.
    orphans: latest::Sender<Orphans>,
}

/// Runs until the owner's end of the channel is dropped.
pub async fn run<S: Store>(
    store: S,
    mut changes: mpsc::Receiver<Vec<Change>>,
    timing: Timing,
    view: Arc<Mutex<WhereaboutsView>>,
    metrics: TaskMetrics,
    health: ApiHealth,
    orphans: latest::Sender<Orphans>,
) {
    let mut returns = health.returns();
    let mut store = store;
    store.follow();
    let mut task = Task {
        store,
        projection: Projection::default(),
        timing,
        synced: false,
        next_round: Instant::now(),
        backoff: Backoff::new(timing.first_retry, timing.max_retry),
        failing: false,
        health,
        foreign_recheck_at: None,
        failing_since: None,
        last_logged: None,
        view,
        metrics,
        orphans,
    };
    loop {
        task.hand_over_orphans();
        let due = (task.synced && task.projection.has_work()).then_some(task.next_round);
        tokio::select! {
            batch = changes.recv() => {
                let Some(batch) = batch else { break };
                task.want(batch);
                while let Ok(batch) = changes.try_recv() {
                    task.want(batch);
                }
            }
            event = task.store.event() => task.saw(event),
            () = sleep_until(due), if due.is_some() => {
                while let Ok(batch) = changes.try_recv() {
                    task.want(batch);
                }
                task.round().await;
            }
            // The API server answers again: the backoff gives way to a round within a moment.
            returned = returns.changed() => {
                if returned.is_ok() && task.failing {
                    task.backoff.reset();
                    task.next_round = Instant::now() + task.backoff.up_to(RETURN_SPREAD);
                }
            }
            () = sleep_until(task.foreign_recheck_at), if task.foreign_recheck_at.is_some() => {
                task.foreign_recheck_at = None;
                task.projection.recheck_foreign();
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

impl<S: Store> Task<S> {
    /// Hands the orphans to the NodeQuarantine writer when they changed: O(addresses touched
    /// since the last call), and O(orphans) when one did.
    fn hand_over_orphans(&mut self) {
        // Before the first list, a previous run's reservations are not known yet.
        if self.synced
            && self
                .projection
                .settle_orphans(crate::netdev::monotonic_ns())
        {
            let orphans = Orphans::new(self.projection.orphan_entries());
            lock(&self.view).orphaned = orphans.len() as u64;
            self.orphans.send_replace(orphans);
        }
    }

    /// Takes in a batch of changed addresses (coalesced per address by the projection).
    fn want(&mut self, batch: Vec<Change>) {
        for change in batch {
            self.projection.want(change.addr, change.want);
        }
    }

    fn saw(&mut self, event: StoreEvent) {
        match event {
            StoreEvent::Listed(held) => {
                self.health.answered();
                self.metrics.projection.lists.inc();
                info!(
                    "whereabouts reservations: {} of this node's listed, watching them",
                    held.len()
                );
                self.projection.relisted(held);
                self.synced = true;
                // A round waiting out failing calls keeps its backoff.
                if !self.failing {
                    self.next_round = Instant::now();
                    self.failing_since = None;
                    let mut view = lock(&self.view);
                    view.last_error = None;
                    view.failing_since = None;
                }
            }
            StoreEvent::Deleted(uid) => {
                self.health.answered();
                if let Some(addr) = self.projection.deleted(&uid) {
                    debug!("whereabouts reservation of {addr} deleted by someone else: made again");
                    self.metrics.projection.recreated.inc();
                    lock(&self.view).recreated_total += 1;
                    // At once: the address has no reservation now.
                    self.next_round = Instant::now();
                }
            }
            StoreEvent::Failed(e) => self.watch_failed(&e),
        }
    }

    /// Makes every call due; stops at the first failure (the API server is likely down for the
    /// rest too) and backs off.
    async fn round(&mut self) {
        let outcome = self.calls().await;
        let now = Instant::now();
        match outcome {
            Ok(()) => {
                self.health.answered();
                self.failing = false;
                self.next_round = now + self.timing.min_interval;
                self.backoff.reset();
                if let Some(since) = self.failing_since.take() {
                    let for_s = SystemTime::now()
                        .duration_since(since)
                        .unwrap_or_default()
                        .as_secs_f64();
                    info!("whereabouts reservations: written again after {for_s:.1}s of failures");
                }
                self.last_logged = None;
                let mut view = lock(&self.view);
                view.last_error = None;
                view.failing_since = None;
            }
            Err(e) => self.failed(&e, now),
        }
        if self.projection.foreign_count() > 0 && self.foreign_recheck_at.is_none() {
            self.foreign_recheck_at = Some(now + FOREIGN_RECHECK);
        }
        // O(reservations), after a round only (a few a second at most), off the owner loop.
        let m = &self.metrics.projection;
        m.reservations.set(self.projection.own_count() as i64);
        m.foreign.set(self.projection.foreign_count() as i64);
        let mut view = lock(&self.view);
        view.reservations = self.projection.own_count() as u64;
        view.foreign = self.projection.foreign_count() as u64;
        view.writes_total = m.writes.get();
    }

    /// A call failed: counted, shown, logged, and the next round backed off.
    fn failed(&mut self, e: &WriteError, now: Instant) {
        self.failing = true;
        self.count_failure(e);
        let delay = self.backoff.next_delay();
        self.next_round = now + delay;
        self.log_failure("write", e, &format!("retrying in {delay:?}"));
    }

    /// The watch failed: counted, shown and logged; the store retries it with its own backoff,
    /// and the calls go on (what the watch misses meanwhile, a list after it tells).
    fn watch_failed(&mut self, e: &WriteError) {
        self.count_failure(e);
        self.log_failure("watch", e, "retried with backoff");
    }

    fn count_failure(&mut self, e: &WriteError) {
        self.metrics.projection.failed(e.reason);
        if e.reason == FailureReason::Unreachable {
            self.health.unreachable();
        }
        let since = *self.failing_since.get_or_insert_with(SystemTime::now);
        let mut view = lock(&self.view);
        view.failures_total += 1;
        view.last_error = Some(format!("{}: {e}", <&str>::from(e.reason)));
        view.failing_since = Some(humantime::format_rfc3339_millis(since).to_string());
    }

    /// The calls of a round.
    async fn calls(&mut self) -> Result<(), WriteError> {
        let mut ops = self.projection.take_ops().into_iter();
        while let Some(op) = ops.next() {
            if let Err(e) = self.call(&op).await {
                for left in std::iter::once(op).chain(ops) {
                    self.projection.failed(left.addr());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    async fn call(&mut self, op: &Op) -> Result<(), WriteError> {
        let reserved = match op {
            Op::Reserve { addr, pod_ref } => self.store.reserve(*addr, pod_ref.as_deref()).await?,
            Op::Watch {
                addr,
                pod_ref,
                pod_uid,
            } => self.store.watch(*addr, pod_ref, pod_uid.as_deref()).await?,
            Op::Delete { addr, uid } => {
                self.store.delete(*addr, uid).await?;
                self.metrics.projection.writes.inc();
                self.projection.released(*addr, uid);
                return Ok(());
            }
        };
        let addr = op.addr();
        match reserved {
            Reserved::Made(uid) => {
                self.metrics.projection.writes.inc();
                let holder = match op {
                    Op::Reserve { pod_ref, .. } => pod_ref.clone(),
                    Op::Watch { pod_ref, .. } => {
                        // Its pod went while no run of the agent watched its reservation.
                        debug!("whereabouts reservation of {addr} gone with its live pod: made");
                        self.metrics.projection.recreated.inc();
                        lock(&self.view).recreated_total += 1;
                        Some(pod_ref.clone())
                    }
                    Op::Delete { .. } => None,
                };
                let hold = Hold {
                    uid,
                    own: true,
                    holder,
                };
                self.projection.held(addr, hold);
            }
            Reserved::Labelled(uid) => {
                self.metrics.projection.writes.inc();
                let hold = Hold {
                    uid,
                    own: false,
                    holder: None,
                };
                self.projection.held(addr, hold);
            }
            Reserved::AlreadyHeld(hold) => self.projection.held(addr, hold),
            Reserved::NotHeld => self.projection.not_held(addr),
        }
        Ok(())
    }

    /// Logs a failure of a `what` (a write, the watch) when its reason is new, and every
    /// `FAILURE_LOG_EVERY` while it lasts.
    fn log_failure(&mut self, what: &str, e: &WriteError, then: &str) {
        let text = e.to_string();
        let due = self
            .last_logged
            .as_ref()
            .is_none_or(|(at, last)| *last != text || at.elapsed() >= FAILURE_LOG_EVERY);
        if due {
            warn!(
                "whereabouts reservations: {what} failed ({}): {text}; {then} (enforcement \
                 on this node is not affected)",
                <&str>::from(e.reason),
            );
            self.last_logged = Some((Instant::now(), text));
        }
    }
}

#[cfg(test)]
mod tests;
