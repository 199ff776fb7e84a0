use std::collections::BTreeMap;

use super::Sorted;

fn as_map(sorted: &Sorted<u32>) -> BTreeMap<u32, u32> {
    sorted.entries.iter().copied().collect()
}

#[test]
fn changes_apply_in_the_order_made_and_the_vector_stays_sorted() {
    let mut sorted = Sorted::from(vec![(5, 50), (1, 10), (3, 30)]);
    let mut model: BTreeMap<u32, u32> = [(1, 10), (3, 30), (5, 50)].into();
    let changes = vec![
        (3, Some(31)),
        (2, Some(20)),
        (2, None),
        (4, Some(40)),
        (1, None),
        (1, Some(11)),
        (9, None),
        (5, None),
        (0, Some(1)),
    ];
    for (k, d) in &changes {
        match d {
            Some(d) => model.insert(*k, *d),
            None => model.remove(k),
        };
    }
    sorted.apply(changes);
    assert_eq!(as_map(&sorted), model);
    assert!(sorted.entries.windows(2).all(|w| w[0].0 < w[1].0));
    for (k, d) in &model {
        assert_eq!(sorted.find(k).map(|(_, d)| d), Some(*d));
    }
    assert_eq!(sorted.find(&2), None);
}

#[test]
fn a_digest_changed_in_place_needs_no_merge() {
    let mut sorted = Sorted::from((0..1000u32).map(|k| (k * 2, k)).collect());
    let before = sorted.entries.as_ptr();
    sorted.apply(vec![(10, Some(7)), (12, Some(8)), (11, None)]);
    assert_eq!(
        sorted.entries.as_ptr(),
        before,
        "updates only: no new vector"
    );
    assert_eq!(sorted.find(&10), Some((5, 7)));
    assert_eq!(sorted.len(), 1000);
}

/// Past its bound the feed keeps the last write of each key instead of every write: it stops
/// growing, counts what it coalesced, and what the mirror takes in ends up the same.
#[test]
fn past_its_bound_the_feed_keeps_the_last_write_of_each_key() {
    use super::{Change, IntentFeed};
    use ipq_common::addr::AddrKey;

    let feed = IntentFeed::with_bound(4);
    let addr = |n: u8| AddrKey::from(std::net::IpAddr::from([10, 0, 0, n]));
    let writes = [
        (1, Some(1)),
        (2, Some(2)),
        (1, Some(3)),
        (3, Some(4)),
        // Past the bound: three writes, two keys.
        (1, Some(5)),
        (2, None),
        (1, Some(6)),
    ];
    let mut model = BTreeMap::new();
    for (n, digest) in writes {
        feed.push(Change::Addr(addr(n), digest));
        match digest {
            Some(d) => model.insert(addr(n).words[3], d),
            None => model.remove(&addr(n).words[3]),
        };
    }
    let (changes, coalesced) = feed.take();
    assert_eq!(coalesced, 3);
    assert_eq!(changes.len(), 6, "four in order, then one per key");
    assert!(feed.is_empty());
    let mut mirror = Sorted::from(Vec::new());
    mirror.apply(
        changes
            .into_iter()
            .map(|change| match change {
                Change::Addr(addr, digest) => (addr.words[3], digest),
                other => panic!("{other:?}"),
            })
            .collect(),
    );
    assert_eq!(as_map(&mirror), model, "the same as every write in order");
    // Taken: the feed keeps writes in order again.
    feed.push(Change::Addr(addr(9), Some(9)));
    assert_eq!(feed.take().1, 0);
}
