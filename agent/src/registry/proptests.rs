//! Properties of the registry over random operation sequences (every policy, a tiny capacity,
//! a handful of addresses and interfaces so that collisions are the rule, not the exception):
//!
//! 1. under `fence-old`, an address never has two live holders whose traffic flows — judged by
//!    the datapath's own verdict functions on the mirrored entries, against a model of every
//!    interface that claimed the address and is not gone;
//! 2. nothing is lost on a full registry: a refused claim changes nothing, and no operation but
//!    the end of a quarantine or a forced release ever drops a record;
//! 3. the datapath mirror built only from emitted effects equals `datapath_entries()`;
//! 4. snapshot → JSON → restore round-trips (and any snapshot, however mangled, is either
//!    restored whole or refused without a change — never a panic);
//! 5. the per-state counts kept at the one choke point always equal a full recount;
//! 6. every change to any record (identity, stale stamp, conflict count included) bumps the
//!    generation, so nothing changed is ever taken for saved.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use ipq_common::{
    addr::AddrEntry,
    verdict::{workload_receives, workload_sends},
};
use proptest::{prelude::*, test_runner::FileFailurePersistence};

use super::*;
use crate::config::EarlyReusePolicy;

const ADDRS: [&str; 6] = [
    "10.0.0.1",
    "10.0.0.2",
    "::ffff:10.0.0.2", // the same address as 10.0.0.2
    "fd00::1",
    "fd00::2",
    "10.0.0.3",
];
const IFINDEXES: u32 = 5;
const CONTAINERS: [Option<&str>; 3] = [None, Some("a"), Some("b")];

fn addr(i: usize) -> IpAddr {
    ADDRS[i % ADDRS.len()].parse().unwrap()
}

fn holder(i: usize) -> Holder {
    let ifindex = 1 + (i / CONTAINERS.len()) as u32 % IFINDEXES;
    let h = Holder::new(ifindex, format!("veth{ifindex}"));
    match CONTAINERS[i % CONTAINERS.len()] {
        // One container names its pod: a remote claim of its address asks the cluster.
        Some(id @ "b") => h.with_container_id(id).with_pod(PodRef {
            namespace: "default".into(),
            name: format!("pod-{ifindex}"),
            uid: None,
        }),
        Some(id) => h.with_container_id(id),
        None => h,
    }
}

#[derive(Clone, Debug)]
enum Op {
    Claim(usize, usize, Source),
    Drain(usize, Option<usize>),
    Gone(u32),
    Stale(usize, u64),
    Advance(u64),
    Tick,
    Release(usize, bool),
    Forget(usize),
    RemoteClaim(usize, bool),
    RemoteClaimAnswered(usize, usize, usize),
    DuplicateSource(usize, u32),
    SnapshotRestore,
}

fn source() -> impl Strategy<Value = Source> {
    prop_oneof![Just(Source::Cni), Just(Source::Api), Just(Source::Netlink)]
}

fn policy() -> impl Strategy<Value = EarlyReusePolicy> {
    prop_oneof![
        Just(EarlyReusePolicy::FenceOld),
        Just(EarlyReusePolicy::RefuseNew),
        Just(EarlyReusePolicy::Observe)
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let a = 0..ADDRS.len();
    let h = 0..(IFINDEXES as usize * CONTAINERS.len());
    let i = 0..=IFINDEXES + 1;
    prop_oneof![
        6 => (a.clone(), h.clone(), source()).prop_map(|(a, h, s)| Op::Claim(a, h, s)),
        2 => (a.clone(), proptest::option::of(h.clone())).prop_map(|(a, h)| Op::Drain(a, h)),
        2 => i.clone().prop_map(Op::Gone),
        2 => (a.clone(), 0..60_000u64).prop_map(|(a, back)| Op::Stale(a, back)),
        3 => (0..40_000u64).prop_map(Op::Advance),
        2 => Just(Op::Tick),
        1 => (a.clone(), any::<bool>()).prop_map(|(a, f)| Op::Release(a, f)),
        1 => a.clone().prop_map(Op::Forget),
        1 => (a.clone(), any::<bool>()).prop_map(|(a, ask)| Op::RemoteClaim(a, ask)),
        1 => (a.clone(), h.clone(), 0..3usize)
            .prop_map(|(a, h, s)| Op::RemoteClaimAnswered(a, h, s)),
        1 => (a, i).prop_map(|(a, i)| Op::DuplicateSource(a, i)),
        1 => Just(Op::SnapshotRestore),
    ]
}

fn settings(policy: EarlyReusePolicy) -> RegistrySettings {
    RegistrySettings {
        policy,
        cooldown: Duration::from_secs(30),
        quiet_period: Duration::from_secs(10),
        max_cooldown: Duration::from_secs(120),
        capacity: 3,
    }
}

/// The world the registry is told about: which interfaces claimed each address and still live.
#[derive(Default)]
struct World {
    live: BTreeMap<IpAddr, BTreeSet<u32>>,
}

impl World {
    /// Live claimants of `addr` whose traffic passes both ways in the datapath.
    fn flowing(&self, addr: IpAddr, entry: Option<&AddrEntry>) -> Vec<u32> {
        self.live.get(&addr).map_or_else(Vec::new, |ifindexes| {
            ifindexes
                .iter()
                .copied()
                .filter(|i| {
                    entry.is_none_or(|e| {
                        workload_sends(*i, e).is_none() && workload_receives(*i, e).is_none()
                    })
                })
                .collect()
        })
    }
}

fn run(policy: EarlyReusePolicy, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = FakeClock::new(1_000_000_000_000);
    let mut reg = Registry::new(settings(policy), clock.clone());
    let mut mirror = BTreeMap::new();
    let mut world = World::default();

    for op in ops {
        let before = reg.lifecycle().snapshot();
        let generation_before = reg.changes().generation();
        let now = clock.now();
        let result = match op {
            Op::Claim(a, h, s) => reg.claim(addr(*a), holder(*h), *s),
            Op::Drain(a, h) => reg.lifecycle_mut().drain(addr(*a), h.map(holder).as_ref()),
            Op::Gone(i) => reg.lifecycle_mut().holder_gone(*i),
            Op::Stale(a, back) => reg
                .lifecycle_mut()
                .stale_seen(addr(*a), now.saturating_sub(back * 1_000_000)),
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(*ms));
                Ok(Vec::new())
            }
            Op::Tick => reg.lifecycle_mut().tick(),
            Op::Release(a, force) => reg.lifecycle_mut().release(addr(*a), *force),
            Op::Forget(a) => reg.lifecycle_mut().forget(addr(*a)),
            Op::RemoteClaim(a, ask) => reg.lifecycle_mut().remote_claim(addr(*a), *ask),
            Op::RemoteClaimAnswered(a, h, standing) => {
                let standing = [
                    PodStanding::Gone,
                    PodStanding::Present,
                    PodStanding::Unknown,
                ][*standing];
                reg.lifecycle_mut()
                    .remote_claim_answered(addr(*a), &holder(*h), standing)
            }
            Op::DuplicateSource(a, i) => reg.lifecycle_mut().duplicate_source(addr(*a), *i),
            Op::SnapshotRestore => {
                // Property 4: through the journal's encoding, into a fresh registry.
                let json = serde_json::to_string(&before).unwrap();
                let parsed: Snapshot = serde_json::from_str(&json).unwrap();
                prop_assert_eq!(&parsed, &before);
                let mut fresh = Registry::new(settings(policy), clock.clone());
                let effects = fresh.lifecycle_mut().restore(parsed.clone()).unwrap();
                let mut fresh_mirror = BTreeMap::new();
                apply_to_mirror(&mut fresh_mirror, &effects);
                prop_assert_eq!(&fresh_mirror, &reg.records().datapath_entries());
                prop_assert_eq!(fresh.lifecycle().snapshot().records, before.records.clone());
                prop_assert_eq!(
                    fresh.records().indexes().next_deadline(),
                    reg.records().indexes().next_deadline()
                );
                // And in place: the live registry restores its own snapshot.
                reg.lifecycle_mut().restore(parsed)
            }
        };

        // Property 3: the mirror follows from the effects alone.
        match &result {
            Ok(effects) => apply_to_mirror(&mut mirror, effects),
            Err(e) => {
                // Property 2, and more: a refusal changes nothing at all.
                prop_assert_eq!(
                    &reg.lifecycle().snapshot().records,
                    &before.records,
                    "{} changed it",
                    e
                );
            }
        }
        prop_assert_eq!(&mirror, &reg.records().datapath_entries(), "after {:?}", op);
        // Property 5.
        for state in [
            StateName::Active,
            StateName::Draining,
            StateName::Quarantined,
        ] {
            prop_assert_eq!(
                reg.records().indexes().count(state),
                reg.records().iter().filter(|r| r.state() == state).count(),
                "{} after {:?}",
                state,
                op
            );
        }
        // Property 6 (a restore to the same records may or may not count as a change).
        if reg.lifecycle().snapshot().records != before.records {
            prop_assert!(
                reg.changes().generation() > generation_before,
                "{:?} changed a record but not the generation",
                op
            );
        }
        if let Err(e) = reg.records().check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
        }

        // Property 2: records disappear only when a quarantine ends or by forced release.
        for old in &before.records {
            if reg.records().get(old.addr).is_some() {
                continue;
            }
            match (op, &old.status) {
                (Op::Tick | Op::Release(..), AddrStatus::Quarantined { until, .. }) => {
                    prop_assert!(*until <= now || matches!(op, Op::Release(_, true)));
                }
                (Op::Release(_, true) | Op::Forget(_), _) => {}
                _ => prop_assert!(false, "{:?} dropped {:?}", op, old),
            }
        }
        if let Err(RegistryError::Full { .. }) = &result {
            prop_assert_eq!(before.records.len(), reg.records().capacity() as usize);
        }

        // The world model.
        match (op, &result) {
            (Op::Claim(a, h, _), Ok(_)) => {
                world
                    .live
                    .entry(addr(*a).to_canonical())
                    .or_default()
                    .insert(holder(*h).ifindex);
            }
            (Op::Gone(i), _) => {
                for ifindexes in world.live.values_mut() {
                    ifindexes.remove(i);
                }
            }
            (Op::Forget(a), Ok(_)) => {
                // The address is the node's: no workload lives on it as far as ipq is told.
                world.live.remove(&addr(*a).to_canonical());
            }
            (Op::Release(a, true), Ok(_)) => {
                let a = addr(*a).to_canonical();
                let was_live = before
                    .records
                    .iter()
                    .any(|r| r.addr == a && r.status.holder().is_some());
                if was_live {
                    // The operator's override: whatever lives there is on its own now.
                    world.live.remove(&a);
                }
            }
            _ => {}
        }

        if policy == EarlyReusePolicy::FenceOld {
            // Property 1.
            let entries = reg.records().datapath_entries();
            for (a, live) in &world.live {
                // No live claimant is ever forgotten (the datapath has one fence slot, so the
                // registry must remember the others to keep the address from falling Free).
                match reg.records().get(*a) {
                    Some(record) => {
                        let known: BTreeSet<u32> = record.live_ifindexes().collect();
                        prop_assert!(
                            live.is_subset(&known),
                            "{} forgot {:?} after {:?}: {:?}",
                            a,
                            live,
                            op,
                            record
                        );
                    }
                    None => prop_assert!(live.len() <= 1, "{} free with {:?} alive", a, live),
                }
                let flowing = world.flowing(*a, entries.get(a));
                prop_assert!(
                    flowing.len() <= 1,
                    "{} has {:?} flowing after {:?}: {:?}",
                    a,
                    flowing,
                    op,
                    reg.records().get(*a)
                );
            }
            // An explicit claim that succeeded makes the claimant the holder.
            if let (Op::Claim(a, h, s), Ok(_)) = (op, &result) {
                if s.is_explicit() {
                    let record = reg.records().get(addr(*a)).unwrap();
                    prop_assert!(record.status.holder().unwrap().same_as(&holder(*h)));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    // Failing seeds are kept next to this file (`proptests.regressions`), in the registry's
    // own directory.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_operations_keep_the_invariants(
        policy in policy(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(policy, &ops)?;
    }

    #[test]
    fn fence_old_never_lets_two_holders_flow(ops in proptest::collection::vec(op(), 1..120)) {
        run(EarlyReusePolicy::FenceOld, &ops)?;
    }

    /// Any snapshot, however mangled, is restored whole or refused without a change.
    #[test]
    fn restore_of_mangled_snapshots_never_panics(
        ops in proptest::collection::vec(op(), 1..40),
        mangles in proptest::collection::vec((0usize..8, 0usize..6, any::<u64>(), 0usize..15), 0..6),
        version in prop_oneof![4 => Just(SNAPSHOT_VERSION), 1 => any::<u32>()],
    ) {
        let clock = FakeClock::new(1_000_000_000_000);
        let mut reg = Registry::new(settings(EarlyReusePolicy::FenceOld), clock.clone());
        for op in &ops {
            let _ = match op {
                Op::Claim(a, h, s) => reg.claim(addr(*a), holder(*h), *s),
                Op::Gone(i) => reg.lifecycle_mut().holder_gone(*i),
                Op::Advance(ms) => {
                    clock.advance(Duration::from_millis(*ms));
                    Ok(Vec::new())
                }
                _ => Ok(Vec::new()),
            };
        }
        let mut snapshot = reg.lifecycle().snapshot();
        snapshot.version = version;
        for (what, which, n, h) in mangles {
            let len = snapshot.records.len();
            match what {
                0 if len > 0 => { let r = snapshot.records[which % len].clone(); snapshot.records.push(r) }
                1 if len > 0 => snapshot.records[which % len].addr = addr(h),
                2 if len > 0 => snapshot.records[which % len].contest.set_fenced(Some(Holder::new(n as u32 % 3, "x"))),
                3 if len > 0 => { snapshot.records[which % len].contest.replace_blocked_claimant(holder(h)); }
                4 if len > 0 => snapshot.records[which % len].status = AddrStatus::Quarantined {
                    since: n % 2_000_000_000_000,
                    until: n.rotate_left(7) % 2_000_000_000_000,
                    last_stale: Some(n),
                    previous: holder(h),
                },
                5 if len > 0 => snapshot.records[which % len].status = AddrStatus::Active {
                    holder: holder(h),
                    since: n,
                },
                6 => snapshot.records.push(AddrRecord::new(addr(h), AddrStatus::Draining {
                    holder: Holder::new(n as u32 % 4, "y"),
                    since: n % 2_000_000_000_000,
                })),
                _ => snapshot.records.clear(),
            }
        }
        // Through JSON, as from the journal.
        let json = serde_json::to_string(&snapshot).unwrap();
        let snapshot: Snapshot = serde_json::from_str(&json).unwrap();

        let mut target = Registry::new(settings(EarlyReusePolicy::FenceOld), clock.clone());
        target.claim("10.9.9.9".parse().unwrap(), holder(0), Source::Cni).unwrap();
        let before = target.lifecycle().snapshot();
        let mut mirror = target.records().datapath_entries();
        match target.lifecycle_mut().restore(snapshot.clone()) {
            Ok(effects) => {
                apply_to_mirror(&mut mirror, &effects);
                prop_assert_eq!(mirror, target.records().datapath_entries());
                prop_assert_eq!(target.records().len(), snapshot.records.len());
                // Restored whole: a second round trip is exact.
                let mut again = Registry::new(settings(EarlyReusePolicy::FenceOld), clock.clone());
                again.lifecycle_mut().restore(target.lifecycle().snapshot()).unwrap();
                prop_assert_eq!(again.lifecycle().snapshot().records, target.lifecycle().snapshot().records);
            }
            Err(_) => prop_assert_eq!(target.lifecycle().snapshot().records, before.records),
        }
        if let Err(e) = target.records().check_invariants() {
            return Err(TestCaseError::fail(e.to_string()));
        }
        // Whatever was restored still takes every operation without panicking.
        for op in &ops {
            let _ = match op {
                Op::Claim(a, h, s) => target.claim(addr(*a), holder(*h), *s),
                Op::Drain(a, h) => target.lifecycle_mut().drain(addr(*a), h.map(holder).as_ref()),
                Op::Gone(i) => target.lifecycle_mut().holder_gone(*i),
                Op::Tick => target.lifecycle_mut().tick(),
                Op::Release(a, f) => target.lifecycle_mut().release(addr(*a), *f),
                _ => Ok(Vec::new()),
            };
            if let Err(e) = target.records().check_invariants() {
                return Err(TestCaseError::fail(e.to_string()));
            }
        }
    }
}
