//! The projection's task against a store double: what it writes, what it makes again, what it
//! never touches, and that a refusing API server is retried with backoff and counted.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::mpsc;

use super::*;
use crate::publish::{EntryState, FailureReason};

/// One reservation in the double: whether ipq watches it (labelled or its own), its podRef
/// and its uid.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reservation {
    watched: bool,
    pod_ref: String,
    uid: String,
    /// Of ipq's own: the holder's podRef it keeps the address for.
    holder: Option<String>,
}

impl Reservation {
    fn hold(&self) -> Hold {
        Hold {
            uid: self.uid.clone(),
            own: self.pod_ref == OWN_POD_REF,
            holder: self.holder.clone(),
        }
    }
}

#[derive(Default)]
struct World {
    reservations: BTreeMap<IpAddr, Reservation>,
    next_uid: u32,
    /// Calls refused while set.
    refusing: bool,
    /// The watch fails (and lists nothing) while set.
    failing_watch: bool,
    calls: Vec<String>,
    /// The podRefs of pods deleted from the API (their containers may still run).
    pods_gone: BTreeSet<String>,
}

impl World {
    /// What a list of the reservations ipq watches finds now.
    fn listed(&self) -> Vec<(IpAddr, Hold)> {
        self.reservations
            .iter()
            .filter(|(_, r)| r.watched)
            .map(|(addr, r)| (*addr, r.hold()))
            .collect()
    }
}

struct FakeStore {
    world: Arc<Mutex<World>>,
    events: mpsc::UnboundedReceiver<StoreEvent>,
    /// The watch's end of `events`.
    watch: mpsc::UnboundedSender<StoreEvent>,
}

fn refused() -> WriteError {
    WriteError {
        reason: FailureReason::Refused,
        message: "forbidden".into(),
    }
}

const OWN_POD_REF: &str = "ipq.dev:quarantine/node-a";

impl FakeStore {
    fn reserved(world: &mut World, addr: IpAddr, pod_ref: Option<&str>) -> Reserved {
        match world.reservations.get_mut(&addr) {
            None => Reserved::NotHeld,
            Some(r) if r.watched => Reserved::AlreadyHeld(r.hold()),
            Some(r) if Some(r.pod_ref.as_str()) == pod_ref => {
                r.watched = true;
                Reserved::Labelled(r.uid.clone())
            }
            Some(_) => Reserved::NotHeld,
        }
    }
}

impl FakeStore {
    /// ipq's own, unless there is one already.
    fn make(world: &mut World, addr: IpAddr, pod_ref: Option<&str>) -> Reserved {
        if world.reservations.contains_key(&addr) {
            return Self::reserved(world, addr, pod_ref);
        }
        world.next_uid += 1;
        let uid = format!("uid-{}", world.next_uid);
        world.reservations.insert(
            addr,
            Reservation {
                watched: true,
                pod_ref: OWN_POD_REF.into(),
                uid: uid.clone(),
                holder: pod_ref.map(str::to_owned),
            },
        );
        Reserved::Made(uid)
    }
}

impl Store for FakeStore {
    fn follow(&mut self) {
        let world = self.world.lock().unwrap();
        let event = if world.failing_watch {
            StoreEvent::Failed(refused())
        } else {
            StoreEvent::Listed(world.listed())
        };
        drop(world);
        self.world.lock().unwrap().calls.push("list".into());
        self.watch.send(event).unwrap();
    }

    async fn reserve(
        &mut self,
        addr: IpAddr,
        pod_ref: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let mut world = self.world.lock().unwrap();
        world.calls.push(format!("reserve {addr}"));
        if world.refusing {
            return Err(refused());
        }
        Ok(Self::make(&mut world, addr, pod_ref))
    }

    async fn watch(
        &mut self,
        addr: IpAddr,
        pod_ref: &str,
        _pod_uid: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let mut world = self.world.lock().unwrap();
        world.calls.push(format!("watch {addr}"));
        if world.refusing {
            return Err(refused());
        }
        if !world.reservations.contains_key(&addr) && world.pods_gone.contains(pod_ref) {
            return Ok(Self::make(&mut world, addr, Some(pod_ref)));
        }
        Ok(Self::reserved(&mut world, addr, Some(pod_ref)))
    }

    async fn delete(&mut self, addr: IpAddr, uid: &str) -> Result<(), WriteError> {
        let mut world = self.world.lock().unwrap();
        world.calls.push(format!("delete {addr}"));
        if world.refusing {
            return Err(refused());
        }
        if world.reservations.get(&addr).is_some_and(|r| r.uid == uid) {
            world.reservations.remove(&addr);
        }
        Ok(())
    }

    async fn event(&mut self) -> StoreEvent {
        match self.events.recv().await {
            Some(event) => event,
            None => std::future::pending().await,
        }
    }
}

struct Harness {
    world: Arc<Mutex<World>>,
    events: mpsc::UnboundedSender<StoreEvent>,
    feed: Feed,
    metrics: Arc<ProjectionMetrics>,
    /// What the NodeQuarantine writer is handed: the orphaned holders.
    orphans: latest::Receiver<Orphans>,
}

fn harness() -> Harness {
    let world = Arc::new(Mutex::new(World::default()));
    let (events, received) = mpsc::unbounded_channel();
    let registry = prometheus::Registry::new();
    let metrics = Arc::new(ProjectionMetrics::register(&registry).expect("metrics register"));
    let feed_full = crate::publish::PublishMetrics::register(&registry)
        .expect("metrics register")
        .feed_full;
    let task_metrics = TaskMetrics {
        projection: metrics.clone(),
        feed_full,
    };
    let store = FakeStore {
        world: world.clone(),
        events: received,
        watch: events.clone(),
    };
    let target = Target {
        node: "node-a".into(),
        namespace: "kube-system".into(),
        network_name: String::new(),
    };
    let (orphans_sender, orphans) = latest::channel(Orphans::default());
    let feed = start_with(
        store,
        &target,
        Timing::default(),
        task_metrics,
        ApiHealth::new(),
        orphans_sender,
    );
    Harness {
        world,
        events,
        feed,
        metrics,
        orphans,
    }
}

fn listed(pod: &str) -> Option<Want> {
    Some(Want {
        listed: true,
        pod_ref: Some(format!("default/{pod}")),
        pod_uid: None,
        live_holder: None,
    })
}

fn live(pod: &str) -> Option<Want> {
    Some(Want {
        listed: false,
        pod_ref: Some(format!("default/{pod}")),
        pod_uid: None,
        live_holder: Some(super::projection::tests::pod_holder(pod)),
    })
}

/// whereabouts' own reservation of a pod's address.
fn whereabouts_own(pod: &str, uid: &str) -> Reservation {
    Reservation {
        watched: false,
        pod_ref: format!("default/{pod}"),
        uid: uid.into(),
        holder: None,
    }
}

fn addr(last: u8) -> IpAddr {
    IpAddr::from([10, 88, 0, last])
}

impl Harness {
    fn reservation(&self, addr: IpAddr) -> Option<Reservation> {
        self.world.lock().unwrap().reservations.get(&addr).cloned()
    }

    /// The orphans last handed to the writer: address, state and the holder's pod.
    fn orphans(&self) -> Vec<(IpAddr, EntryState, String)> {
        self.orphans
            .borrow()
            .iter()
            .map(|(addr, entry)| {
                let pod = entry.holder.pod().map_or(String::new(), |p| p.name.clone());
                (*addr, entry.state, pod)
            })
            .collect()
    }

    /// Lets the task run until the orphans handed over are `expected`.
    async fn until_orphans(&self, what: &str, expected: &[(IpAddr, &str)]) {
        let expected: Vec<(IpAddr, EntryState, String)> = expected
            .iter()
            .map(|(addr, pod)| (*addr, EntryState::Orphaned, (*pod).to_owned()))
            .collect();
        for _ in 0..200 {
            if self.orphans() == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: orphans {:?}", self.orphans());
    }

    /// Lets the task run until `done` holds (paused time: the task's timers fire at once).
    async fn until(&self, what: &str, done: impl Fn(&World) -> bool) {
        for _ in 0..200 {
            if done(&self.world.lock().unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: calls {:?}", self.world.lock().unwrap().calls);
    }

    /// Lets the task run until its metrics show `done`: what the task sets once a round has
    /// taken in a change, whether or not that round called the store.
    async fn until_counted(&self, what: &str, done: impl Fn(&ProjectionMetrics) -> bool) {
        for _ in 0..200 {
            if done(&self.metrics) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{what}: calls {:?}", self.world.lock().unwrap().calls);
    }
}

#[tokio::test(start_paused = true)]
async fn a_quarantine_is_reserved_made_again_when_deleted_and_released_when_it_ends() {
    let mut h = harness();
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    h.until("reserved", |w| w.reservations.contains_key(&addr(10)))
        .await;
    let made = h.reservation(addr(10)).unwrap();
    assert_eq!(made.pod_ref, OWN_POD_REF);

    // whereabouts deletes it (its control loop, DEL or reconciler) while it is still listed.
    h.world.lock().unwrap().reservations.remove(&addr(10));
    h.events
        .send(StoreEvent::Deleted(made.uid.clone()))
        .unwrap();
    h.until("made again", |w| w.reservations.contains_key(&addr(10)))
        .await;
    assert_ne!(h.reservation(addr(10)).unwrap().uid, made.uid);
    assert_eq!(h.metrics.recreated.get(), 1);

    h.feed.send(addr(10), None);
    h.until("released", |w| w.reservations.is_empty()).await;
    assert_eq!(h.metrics.writes.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_force_deleted_pods_address_is_kept_when_whereabouts_frees_it_under_the_live_holder() {
    let mut h = harness();
    h.world
        .lock()
        .unwrap()
        .reservations
        .insert(addr(10), whereabouts_own("web-1", "wb-1"));
    h.feed.send(addr(10), live("web-1"));
    h.feed.launch();
    h.until("whereabouts' own labelled", |w| {
        w.reservations[&addr(10)].watched
    })
    .await;
    assert_eq!(
        h.reservation(addr(10)).unwrap().uid,
        "wb-1",
        "its own, only labelled"
    );
    assert_eq!(h.orphans(), [], "a live pod's holder is no orphan");
    // The Pod's DELETE: whereabouts' control loop frees the address; the holder still runs.
    h.world.lock().unwrap().reservations.remove(&addr(10));
    h.events.send(StoreEvent::Deleted("wb-1".into())).unwrap();
    h.until("ipq's own made", |w| {
        w.reservations
            .get(&addr(10))
            .is_some_and(|r| r.pod_ref == OWN_POD_REF)
    })
    .await;
    h.until_orphans("the holder listed as orphaned", &[(addr(10), "web-1")])
        .await;
    let entry = h.orphans.borrow()[&addr(10)].clone();
    assert_eq!(entry.until, None, "an orphan never ends on a timer");
    assert_eq!(entry.holder.ifname, "veth-web-1");
    // The holder dies: the registry lists its quarantine, and the orphan goes.
    h.feed.send(addr(10), listed("web-1"));
    h.until_orphans("no orphan once the holder is gone", &[])
        .await;
    // The quarantine runs and ends: ipq's goes.
    h.feed.send(addr(10), None);
    h.until("released", |w| w.reservations.is_empty()).await;
}

#[tokio::test(start_paused = true)]
async fn another_pods_reservation_is_never_touched() {
    let mut h = harness();
    let other = whereabouts_own("someone-else", "theirs");
    h.world
        .lock()
        .unwrap()
        .reservations
        .insert(addr(10), other.clone());
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    h.until("looked at", |w| {
        w.calls.iter().any(|c| c.starts_with("reserve"))
    })
    .await;
    h.until_counted("counted as another pod's", |m| m.foreign.get() == 1)
        .await;
    assert_eq!(h.reservation(addr(10)), Some(other.clone()));
    // The address is no longer wanted: the round that takes that in sets the count of foreign
    // reservations to 0, after any call it would have made about them.
    h.feed.send(addr(10), None);
    h.until_counted("the unwanted address taken in", |m| m.foreign.get() == 0)
        .await;
    assert_eq!(h.reservation(addr(10)), Some(other));
    assert!(!h
        .world
        .lock()
        .unwrap()
        .calls
        .iter()
        .any(|c| c.starts_with("delete")));
}

#[tokio::test(start_paused = true)]
async fn a_foreign_reservation_that_goes_is_replaced_by_ipqs() {
    let mut h = harness();
    h.world
        .lock()
        .unwrap()
        .reservations
        .insert(addr(10), whereabouts_own("someone-else", "theirs"));
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    h.until("seen as another pod's", |w| {
        w.calls.iter().any(|c| c.starts_with("reserve"))
    })
    .await;
    // whereabouts frees it: ipq's follows within the recheck.
    h.world.lock().unwrap().reservations.remove(&addr(10));
    h.until("ipq's made", |w| {
        w.reservations
            .get(&addr(10))
            .is_some_and(|r| r.pod_ref == OWN_POD_REF)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_refusing_api_server_is_retried_with_backoff_and_counted() {
    let mut h = harness();
    h.world.lock().unwrap().refusing = true;
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The list is the watch's (not refused here); the calls are the rounds'.
    let tries = h
        .world
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| *c != "list")
        .count();
    // 0.5 + 1 + 2 s of backoff: at most 3 attempts in 3 s.
    assert!((1..=3).contains(&tries), "{tries} attempts in 3 s");
    let refused = h.metrics.failures.with_label_values(&["refused"]).get();
    assert_eq!(refused, tries as u64);
    let view = h.feed.view();
    assert_eq!(view.failures_total, tries as u64);
    assert!(
        view.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("refused: forbidden")),
        "{view:?}"
    );
    h.world.lock().unwrap().refusing = false;
    h.until("reserved once the API server accepts", |w| {
        w.reservations.contains_key(&addr(10))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    let view = h.feed.view();
    assert_eq!(
        (view.reservations, view.last_error),
        (1, None),
        "ipq status after it"
    );
}

#[tokio::test(start_paused = true)]
async fn a_previous_runs_reservations_are_kept_or_deleted_by_the_first_round() {
    let mut h = harness();
    {
        let mut world = h.world.lock().unwrap();
        for (last, uid) in [(10, "kept"), (12, "stale")] {
            world.reservations.insert(
                addr(last),
                Reservation {
                    watched: true,
                    pod_ref: OWN_POD_REF.into(),
                    uid: uid.into(),
                    holder: None,
                },
            );
        }
    }
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    h.until("the stale one deleted", |w| {
        !w.reservations.contains_key(&addr(12))
    })
    .await;
    assert_eq!(h.reservation(addr(10)).unwrap().uid, "kept");
    assert_eq!(h.metrics.reservations.get(), 1);
}

/// A watch that fails before its first list (RBAC without `list`, say): counted and shown, and
/// no call is made until a complete list says what is held (a previous run's reservations would
/// otherwise be made again or deleted).
#[tokio::test(start_paused = true)]
async fn nothing_is_called_before_the_watchs_first_complete_list() {
    let mut h = harness();
    h.world.lock().unwrap().failing_watch = true;
    h.feed.send(addr(10), listed("web-1"));
    h.feed.launch();
    h.until_counted("the watch's failure counted", |m| {
        m.failures.with_label_values(&["refused"]).get() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        h.world.lock().unwrap().calls,
        ["list"],
        "no call before a list"
    );
    assert!(h.feed.view().last_error.is_some());
    // The watcher, retrying, lists at last.
    let listed = h.world.lock().unwrap().listed();
    h.events.send(StoreEvent::Listed(listed)).unwrap();
    h.until("reserved after the list", |w| {
        w.reservations.contains_key(&addr(10))
    })
    .await;
}

/// The watch expired (410 Gone: the API server's history compacted, or the API server
/// restarted) and the watcher lists again: what changed while it did not watch is taken from
/// the new list. A reservation of ipq's deleted meanwhile is made again, a live holder's freed
/// by whereabouts (its pod force-deleted) becomes ipq's own, and nothing is made twice or
/// deleted.
#[tokio::test(start_paused = true)]
async fn a_list_after_the_watch_expired_makes_good_what_it_missed() {
    let mut h = harness();
    h.world
        .lock()
        .unwrap()
        .reservations
        .insert(addr(11), whereabouts_own("web-2", "wb-2"));
    h.feed.send(addr(10), listed("web-1"));
    h.feed.send(addr(11), live("web-2"));
    h.feed.send(addr(12), listed("web-3"));
    h.feed.launch();
    h.until("held", |w| {
        w.reservations.len() == 3 && w.reservations.values().all(|r| r.watched)
    })
    .await;
    let before = h.world.lock().unwrap().reservations.clone();
    // Unseen by the watch: someone deletes ipq's own of .10; web-2 is force-deleted and
    // whereabouts frees its address while its container runs here.
    {
        let mut world = h.world.lock().unwrap();
        world.reservations.remove(&addr(10));
        world.reservations.remove(&addr(11));
        world.pods_gone.insert("default/web-2".into());
        world.calls.clear();
    }
    let listed = h.world.lock().unwrap().listed();
    h.events.send(StoreEvent::Listed(listed)).unwrap();
    h.until("both made good", |w| {
        w.reservations.len() == 3 && w.reservations.values().all(|r| r.pod_ref == OWN_POD_REF)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let world = h.world.lock().unwrap();
    assert_eq!(
        world.reservations[&addr(11)].holder.as_deref(),
        Some("default/web-2"),
        "kept for the live holder"
    );
    assert_eq!(
        world.reservations[&addr(12)],
        before[&addr(12)],
        "untouched"
    );
    let mut calls = world.calls.clone();
    calls.sort();
    assert_eq!(
        calls,
        ["reserve 10.88.0.10", "watch 10.88.0.11"],
        "one call per address that changed, no delete"
    );
}

/// An earlier run made ipq's own for a live holder whose pod was force-deleted; the new run
/// (a DaemonSet rollout) finds it and keeps it for as long as the holder lives and its
/// quarantine runs: never a delete in between.
#[tokio::test(start_paused = true)]
async fn a_restarted_agent_keeps_the_reservation_of_a_live_holder_whose_pod_went() {
    let mut h = harness();
    let own = Reservation {
        watched: true,
        pod_ref: OWN_POD_REF.into(),
        uid: "made-before".into(),
        holder: Some("default/web-1".into()),
    };
    h.world
        .lock()
        .unwrap()
        .reservations
        .insert(addr(10), own.clone());
    h.feed.send(addr(10), live("web-1"));
    h.feed.launch();
    h.until("listed", |w| w.calls.iter().any(|c| c == "list"))
        .await;
    h.until_orphans(
        "the holder listed as orphaned again, from the reservation made before",
        &[(addr(10), "web-1")],
    )
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    h.feed.send(addr(10), listed("web-1"));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.reservation(addr(10)), Some(own));
    assert!(
        !h.world
            .lock()
            .unwrap()
            .calls
            .iter()
            .any(|c| c.starts_with("delete")),
        "never deleted while the holder lives or its quarantine runs"
    );
    assert_eq!(h.metrics.reservations.get(), 1);
    h.feed.send(addr(10), None);
    h.until("released when the quarantine ends", |w| {
        w.reservations.is_empty()
    })
    .await;
}

/// The force delete lands while the agent restarts: whereabouts deletes its reservation with
/// no agent watching. The new run finds the live holder's reservation missing and its pod
/// gone, and makes ipq's own.
#[tokio::test(start_paused = true)]
async fn a_pod_force_deleted_while_the_agent_was_down_gets_ipqs_reservation() {
    let mut h = harness();
    h.world
        .lock()
        .unwrap()
        .pods_gone
        .insert("default/web-1".into());
    // A pod that lives, not whereabouts': looked at, left alone.
    h.feed.send(addr(11), live("web-2"));
    h.feed.send(addr(10), live("web-1"));
    h.feed.launch();
    h.until("ipq's own made", |w| {
        w.reservations.get(&addr(10)).is_some_and(|r| {
            r.pod_ref == OWN_POD_REF && r.holder.as_deref() == Some("default/web-1")
        })
    })
    .await;
    assert_eq!(h.metrics.recreated.get(), 1);
    h.until_orphans("only the pod that went is orphaned", &[(addr(10), "web-1")])
        .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let world = h.world.lock().unwrap();
    assert!(world.reservations.contains_key(&addr(10)), "kept");
    assert!(!world.reservations.contains_key(&addr(11)));
    assert!(!world.calls.iter().any(|c| c.starts_with("delete")));
}
