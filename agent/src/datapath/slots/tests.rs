use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        atomic::{fence, AtomicBool, AtomicU64, Ordering},
        Arc,
    },
};

use ipq_common::{
    addr::{AddrState, FLAG_OBSERVE_ONLY},
    slots::{slot_buckets_of, SLOTS_MAGIC},
};
use proptest::prelude::*;

use super::*;

fn key(i: u32) -> AddrKey {
    AddrKey::from_ipv4(Ipv4Addr::from(0x0a00_0000 + i))
}

fn entry(tag: u32) -> AddrEntry {
    AddrEntry::new(AddrState::Active, tag, u64::from(tag))
}

/// Every invariant of a table at rest against the model.
fn check(table: &SlotTable, model: &BTreeMap<AddrKey, AddrEntry>) {
    assert_eq!(table.len(), model.len());
    let stored: BTreeMap<AddrKey, AddrEntry> = table.iter().collect();
    assert_eq!(stored.len(), model.len(), "a key is stored twice");
    for (k, e) in model {
        let (first, second) = table.layout().buckets_of(k);
        let slot = table.find(k).expect("a stored key is found");
        let bucket = (slot / SLOT_WAYS as usize) as u32;
        assert!(bucket == first || bucket == second);
        assert_eq!(table.get(k).as_ref().map(|e| e.state), Some(e.state));
        assert_eq!(
            table.get(k).map(|e| e.holder_ifindex),
            Some(e.holder_ifindex)
        );
    }
    for cell in table.cells().slots() {
        assert_eq!(
            cell.seq.load(Ordering::Relaxed) & 1,
            0,
            "a slot left mid-write"
        );
        assert_eq!(
            cell.version.load(Ordering::Relaxed) & 1,
            0,
            "a version left odd"
        );
        if !cell.occupied() {
            assert_eq!(cell.key(), AddrKey::UNSPECIFIED);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Put(u32, u32),
    Remove(u32),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    // 80 keys over 64 slots: the table fills, moves occupants, and refuses some inserts.
    prop::collection::vec(
        prop_oneof![
            3 => (0u32..80, 1u32..1000).prop_map(|(k, t)| Op::Put(k, t)),
            1 => (0u32..80).prop_map(Op::Remove),
        ],
        1..300,
    )
}

proptest! {
    #[test]
    fn the_table_stores_exactly_what_the_model_holds(ops in ops(), seed in any::<u64>()) {
        let mut table = SlotTable::on_heap(16, seed);
        let mut model = BTreeMap::new();
        for op in ops {
            match op {
                Op::Put(k, t) => match table.put(&key(k), &entry(t)) {
                    Ok(()) => {
                        model.insert(key(k), entry(t));
                    }
                    Err(DatapathError::Full { .. }) => {
                        // Refused only when the key was new and nothing could move.
                        prop_assert!(!model.contains_key(&key(k)));
                        prop_assert!(model.len() >= 32, "refused at {} of 64", model.len());
                    }
                    Err(e) => panic!("{e}"),
                },
                Op::Remove(k) => {
                    let had = model.remove(&key(k));
                    prop_assert_eq!(table.remove(&key(k)).map(|e| e.holder_ifindex),
                        had.map(|e| e.holder_ifindex));
                }
            }
            check(&table, &model);
        }
    }
}

#[test]
fn a_table_at_half_load_takes_every_address_of_a_subnet() {
    // The production ratio: two slots per address. 65536 addresses of one /16.
    let mut table = SlotTable::on_heap(ipq_common::slots::slot_buckets(65536), 0x5eed);
    for i in 0..65536 {
        table
            .put(&key(i), &entry(i + 1))
            .expect("room at half load");
    }
    assert_eq!(table.len(), 65536);
    for i in (0..65536).step_by(97) {
        assert_eq!(table.get(&key(i)).map(|e| e.holder_ifindex), Some(i + 1));
    }
}

#[test]
fn a_full_registry_at_the_most_load_the_sizing_allows_has_every_address_stored() {
    // `capacity = 81920` fills its table to 5/8, the most `slot_buckets` allows: addresses of
    // one subnet (neighbours in every bit a hash mixes), then every one of them released and
    // as many others taken, as a node's churn does.
    let capacity = 81920;
    let buckets = ipq_common::slots::slot_buckets(capacity);
    assert_eq!(
        u64::from(buckets) * 4 * 5,
        u64::from(capacity) * 8,
        "5/8 full"
    );
    for seed in [0x5eed, 0xdead_beef, 1] {
        let mut table = SlotTable::on_heap(buckets, seed);
        for i in 0..capacity {
            table.put(&key(i), &entry(i + 1)).expect("room at 5/8");
        }
        assert_eq!(table.len(), capacity as usize);
        for i in (0..capacity).step_by(2) {
            table.remove(&key(i));
            let other = capacity + i;
            table
                .put(&key(other), &entry(other + 1))
                .expect("room after churn");
        }
        for i in (0..2 * capacity).step_by(31) {
            // The odd of the first, the even of the second (`capacity` is even).
            let want = (i < capacity && i % 2 == 1 || i >= capacity && i % 2 == 0).then_some(i + 1);
            assert_eq!(table.get(&key(i)).map(|e| e.holder_ifindex), want, "{i}");
        }
    }
}

#[test]
fn an_update_keeps_the_stamps_the_programs_wrote() {
    let mut table = SlotTable::on_heap(16, 7);
    table.put(&key(1), &entry(1)).unwrap();
    let slot = table.find(&key(1)).unwrap();
    table.cells().all()[slot]
        .last_stale_ns
        .store(42, Ordering::Relaxed);
    let mut next = entry(2);
    next.last_stale_ns = 0;
    table.put(&key(1), &next).unwrap();
    let stored = table.get(&key(1)).unwrap();
    assert_eq!((stored.holder_ifindex, stored.last_stale_ns), (2, 42));
}

#[test]
fn a_table_is_set_up_once_and_reopened_with_its_seed() {
    let table = SlotTable::on_heap(16, 99);
    let cells = table.cells().all();
    let meta = cells[16 * SLOT_WAYS as usize].meta();
    assert_eq!((meta.magic, meta.buckets, meta.seed), (SLOTS_MAGIC, 16, 99));
    let again = SlotCells::leaked(cells).adopt(16, None).unwrap();
    assert_eq!(again.seed(), 99);
    assert!(matches!(
        SlotCells::leaked(cells).adopt(16, Some(100)),
        Err(DatapathError::SlotsSeed)
    ));
    let blank: &'static [SlotCell] = Box::leak((0..65).map(|_| SlotCell::default()).collect());
    assert!(matches!(
        SlotCells::leaked(blank).adopt(16, None),
        Err(DatapathError::SlotsNotSetUp)
    ));
}

#[test]
fn settle_ends_writes_a_killed_agent_left_half_done() {
    let mut table = SlotTable::on_heap(16, 3);
    table.put(&key(5), &entry(5)).unwrap();
    let slot = table.find(&key(5)).unwrap();
    table.cells().all()[slot]
        .seq
        .fetch_add(1, Ordering::Relaxed);
    table.version_of(&key(5)).fetch_add(1, Ordering::Relaxed);
    table.cells().settle();
    check(&table, &BTreeMap::from([(key(5), entry(5))]));
}

/// What the programs conclude (`ebpf/src/slots.rs`, the same steps in Rust).
#[derive(Debug, PartialEq)]
enum Probe {
    Hit(AddrEntry),
    Miss,
    Unsure,
}

fn probe(cells: &[SlotCell], buckets: u32, seed: u64, key: &AddrKey) -> Probe {
    let (first, second) = slot_buckets_of(key, seed, buckets - 1);
    let home = &cells[(first * SLOT_WAYS) as usize];
    let version = home.version.load(Ordering::Acquire);
    for bucket in [first, second] {
        for cell in &cells[SlotLayout::slot_range(bucket)] {
            let seq = cell.seq.load(Ordering::Acquire);
            if cell.key() != *key {
                continue;
            }
            let entry = cell.entry();
            fence(Ordering::Acquire);
            let after = cell.seq.load(Ordering::Relaxed);
            if seq != after || seq & 1 != 0 {
                return Probe::Unsure;
            }
            if entry.state != 0 {
                return Probe::Hit(entry);
            }
        }
    }
    fence(Ordering::Acquire);
    if home.version.load(Ordering::Relaxed) == version && version & 1 == 0 {
        Probe::Miss
    } else {
        Probe::Unsure
    }
}

/// A reader on another CPU never misses an address that stays in the table while others are
/// added, moved and removed around it, and never takes a mix of two writes: each entry the
/// writer stores has `holder == fenced == since` and observe-only set, and any mix of two
/// such entries would break that.
#[test]
fn readers_racing_the_writer_never_miss_a_stored_address_nor_see_a_torn_entry() {
    let buckets = 16;
    let mut table = SlotTable::on_heap(buckets, 0xfeed);
    let cells = table.cells().all();
    let seed = table.layout().seed();
    let steady: Vec<AddrKey> = (0..8).map(key).collect();
    let tagged = |tag: u32| AddrEntry {
        fenced_ifindex: tag,
        flags: FLAG_OBSERVE_ONLY,
        ..entry(tag)
    };
    for k in &steady {
        table.put(k, &tagged(1)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let unsure = Arc::new(AtomicU64::new(0));
    let reader = {
        let (stop, unsure, steady) = (stop.clone(), unsure.clone(), steady.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) || reads < 100_000 {
                for k in &steady {
                    match probe(cells, buckets, seed, k) {
                        Probe::Hit(e) => {
                            assert!(
                                e.holder_ifindex == e.fenced_ifindex
                                    && u64::from(e.holder_ifindex) == e.since_ns
                                    && e.flags == FLAG_OBSERVE_ONLY,
                                "torn entry {e:?}"
                            );
                        }
                        Probe::Miss => panic!("{k:?} missed while stored"),
                        Probe::Unsure => {
                            unsure.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads += 1;
                }
            }
            reads
        })
    };
    // Churn: rewrite the steady keys and fill and empty the rest of the table, which forces
    // moves of the steady keys between their buckets.
    let mut steady_moves = 0u64;
    for round in 0..20_000u32 {
        for k in &steady {
            table.put(k, &tagged(round + 2)).unwrap();
        }
        let before: Vec<usize> = steady.iter().map(|k| table.find(k).unwrap()).collect();
        // Fillers new in every round fill the table to over 90 %, landing in other buckets
        // each time, so that the steady keys are moved out of their way.
        let fillers: Vec<AddrKey> = (0..52).map(|j| key(1000 + round * 64 + j)).collect();
        for k in &fillers {
            let _ = table.put(k, &tagged(round + 2));
        }
        steady_moves += steady
            .iter()
            .zip(&before)
            .filter(|(k, &slot)| table.find(k) != Some(slot))
            .count() as u64;
        for k in &fillers {
            table.remove(k);
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(
        steady_moves > 5_000,
        "only {steady_moves} moves of the steady keys"
    );
    let reads = reader
        .join()
        .expect("the reader saw only whole entries and no misses");
    assert!(reads >= 100_000);
    eprintln!(
        "{reads} probes, {} unsure (asked the hash map), {steady_moves} moves of the \
         steady keys, {} moves in all",
        unsure.load(Ordering::Relaxed),
        table.moves()
    );
}
