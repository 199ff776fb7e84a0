//! The projection's task against a store double: what it writes, what it makes again, what it
//! never touches, and that a refusing API server is retried with backoff and counted.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::mpsc;

use super::*;
use crate::{
    publish::{EntryState, FailureReason},
    registry::{Holder, PodRef},
};

/// One reservation in the double: whose it is, and its uid.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reservation {
    ours: bool,
    pod_ref: String,
    uid: String,
}

#[derive(Default)]
struct World {
    reservations: BTreeMap<IpAddr, Reservation>,
    next_uid: u32,
    /// Calls refused while set.
    refusing: bool,
    calls: Vec<String>,
}

struct FakeStore {
    world: Arc<Mutex<World>>,
    events: mpsc::UnboundedReceiver<StoreEvent>,
}

fn refused() -> WriteError {
    WriteError {
        reason: FailureReason::Refused,
        message: "forbidden".into(),
    }
}

impl Store for FakeStore {
    async fn sync(&mut self) -> Result<Vec<(IpAddr, String)>, WriteError> {
        let mut world = self.world.lock().unwrap();
        world.calls.push("sync".into());
        if world.refusing {
            return Err(refused());
        }
        Ok(world
            .reservations
            .iter()
            .filter(|(_, r)| r.ours)
            .map(|(addr, r)| (*addr, r.uid.clone()))
            .collect())
    }

    async fn create(
        &mut self,
        addr: IpAddr,
        holder_pod_ref: Option<&str>,
    ) -> Result<Created, WriteError> {
        let mut world = self.world.lock().unwrap();
        world.calls.push(format!("create {addr}"));
        if world.refusing {
            return Err(refused());
        }
        world.next_uid += 1;
        let uid = format!("uid-{}", world.next_uid);
        let ours = Reservation {
            ours: true,
            pod_ref: "ipq.dev:quarantine/node-a".into(),
            uid: uid.clone(),
        };
        match world.reservations.get(&addr).cloned() {
            None => {
                world.reservations.insert(addr, ours);
                Ok(Created::Made(uid))
            }
            Some(r) if r.ours => Ok(Created::Found(r.uid)),
            Some(r) if Some(r.pod_ref.as_str()) == holder_pod_ref => {
                let adopted = Reservation { uid: r.uid, ..ours };
                world.reservations.insert(addr, adopted.clone());
                Ok(Created::Adopted(adopted.uid))
            }
            Some(_) => Ok(Created::Foreign),
        }
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
    metrics: Arc<Metrics>,
}

fn harness() -> Harness {
    let world = Arc::new(Mutex::new(World::default()));
    let (events, received) = mpsc::unbounded_channel();
    let metrics = Metrics::for_tests();
    let store = FakeStore {
        world: world.clone(),
        events: received,
    };
    let feed = start_with(store, Timing::default(), metrics.clone());
    Harness {
        world,
        events,
        feed,
        metrics,
    }
}

fn entry(pod: &str) -> PublishedEntry {
    PublishedEntry {
        state: EntryState::Quarantined,
        since: 1,
        until: Some(2),
        holder: Holder::new(3, "veth3").with_identity(
            None,
            Some("eth0".into()),
            None,
            None,
            Some(PodRef {
                namespace: "default".into(),
                name: pod.into(),
                uid: None,
            }),
        ),
    }
}

fn addr(last: u8) -> IpAddr {
    IpAddr::from([10, 88, 0, last])
}

impl Harness {
    fn reservation(&self, addr: IpAddr) -> Option<Reservation> {
        self.world.lock().unwrap().reservations.get(&addr).cloned()
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
}

#[tokio::test(start_paused = true)]
async fn a_listed_address_is_reserved_made_again_when_deleted_and_released_when_unlisted() {
    let mut h = harness();
    h.feed.send(addr(10), Some(entry("web-1")));
    h.feed.launch();
    h.until("reserved", |w| w.reservations.contains_key(&addr(10)))
        .await;
    let made = h.reservation(addr(10)).unwrap();
    assert!(made.ours);

    // whereabouts deletes it (its control loop, DEL or reconciler) while it is still listed.
    h.world.lock().unwrap().reservations.remove(&addr(10));
    h.events
        .send(StoreEvent::Deleted(made.uid.clone()))
        .unwrap();
    h.until("made again", |w| w.reservations.contains_key(&addr(10)))
        .await;
    assert_ne!(h.reservation(addr(10)).unwrap().uid, made.uid);
    assert_eq!(h.metrics.whereabouts.recreated.get(), 1);

    h.feed.send(addr(10), None);
    h.until("released", |w| w.reservations.is_empty()).await;
    assert_eq!(h.metrics.whereabouts.writes.get(), 3);
}

#[tokio::test(start_paused = true)]
async fn another_pods_reservation_is_never_touched_and_the_holders_own_is_adopted() {
    let mut h = harness();
    let other = Reservation {
        ours: false,
        pod_ref: "default/someone-else".into(),
        uid: "theirs".into(),
    };
    let departed = Reservation {
        ours: false,
        pod_ref: "default/web-2".into(),
        uid: "departed".into(),
    };
    {
        let mut world = h.world.lock().unwrap();
        world.reservations.insert(addr(10), other.clone());
        world.reservations.insert(addr(11), departed);
    }
    h.feed.send(addr(10), Some(entry("web-1")));
    h.feed.send(addr(11), Some(entry("web-2")));
    h.feed.launch();
    h.until("adopted", |w| w.reservations[&addr(11)].ours).await;
    assert_eq!(
        h.reservation(addr(11)).unwrap().uid,
        "departed",
        "taken over in place"
    );
    // Unlisted: ipq deletes its own, and still leaves the other pod's alone.
    h.feed.send(addr(10), None);
    h.feed.send(addr(11), None);
    h.until("released", |w| !w.reservations.contains_key(&addr(11)))
        .await;
    assert_eq!(h.reservation(addr(10)), Some(other));
    assert!(!h
        .world
        .lock()
        .unwrap()
        .calls
        .contains(&format!("delete {}", addr(10))));
}

#[tokio::test(start_paused = true)]
async fn a_foreign_reservation_that_goes_is_replaced_by_ipqs() {
    let mut h = harness();
    h.world.lock().unwrap().reservations.insert(
        addr(10),
        Reservation {
            ours: false,
            pod_ref: "default/someone-else".into(),
            uid: "theirs".into(),
        },
    );
    h.feed.send(addr(10), Some(entry("web-1")));
    h.feed.launch();
    h.until("seen as foreign", |w| {
        w.calls.iter().any(|c| c.starts_with("create"))
    })
    .await;
    // whereabouts frees it: ipq's follows within the recheck.
    h.world.lock().unwrap().reservations.remove(&addr(10));
    h.until("ipq's made", |w| {
        w.reservations.get(&addr(10)).is_some_and(|r| r.ours)
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_refusing_api_server_is_retried_with_backoff_and_counted() {
    let mut h = harness();
    h.world.lock().unwrap().refusing = true;
    h.feed.send(addr(10), Some(entry("web-1")));
    h.feed.launch();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tries = h.world.lock().unwrap().calls.len();
    // 0.5 + 1 + 2 s of backoff: at most 3 attempts in 3 s, whatever the churn.
    assert!((1..=3).contains(&tries), "{tries} attempts in 3 s");
    let refused = h
        .metrics
        .whereabouts
        .failures
        .with_label_values(&["refused"])
        .get();
    assert_eq!(refused, tries as u64);
    h.world.lock().unwrap().refusing = false;
    h.until("reserved once the API server accepts", |w| {
        w.reservations.contains_key(&addr(10))
    })
    .await;
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
                    ours: true,
                    pod_ref: "ipq.dev:quarantine/node-a".into(),
                    uid: uid.into(),
                },
            );
        }
    }
    h.feed.send(addr(10), Some(entry("web-1")));
    h.feed.launch();
    h.until("the stale one deleted", |w| {
        !w.reservations.contains_key(&addr(12))
    })
    .await;
    assert_eq!(h.reservation(addr(10)).unwrap().uid, "kept");
    assert_eq!(h.metrics.whereabouts.reservations.get(), 1);
}
