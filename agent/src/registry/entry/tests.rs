use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::{AddrEntry, AddrKey, AddrState, FLAG_OBSERVE_ONLY};

use super::{datapath_entry, merge, record_from_entry};
use crate::registry::{AddrRecord, AddrStatus, Holder, RegistrySettings};

const NOW: u64 = 1_000_000_000_000;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn active(addr: &str, ifindex: u32, name: &str) -> AddrRecord {
    AddrRecord::new(
        ip(addr),
        AddrStatus::Active {
            holder: Holder::new(ifindex, name).with_identity(
                Some("c0ffee".into()),
                Some("eth0".into()),
                None,
                None,
                None,
            ),
            since: NOW - 10,
        },
    )
}

fn names() -> BTreeMap<u32, String> {
    BTreeMap::from([(7, "veth7".to_owned()), (8, "veth8".to_owned())])
}

#[test]
fn a_record_and_its_entry_map_both_ways() {
    let record = active("10.0.0.1", 7, "veth7");
    let entry = datapath_entry(&record);
    let back = record_from_entry(
        ip("10.0.0.1"),
        &entry,
        NOW,
        &RegistrySettings::default(),
        &names(),
    )
    .expect("an active entry is a record");
    assert_eq!(datapath_entry(&back), entry);
    assert_eq!(
        back.status.holder().map(|h| h.ifname.as_str()),
        Some("veth7")
    );
    // An entry of a state this build does not know, or a live one without its holder, is none.
    let mut unknown = entry;
    unknown.state = 99;
    assert!(record_from_entry(
        ip("10.0.0.1"),
        &unknown,
        NOW,
        &RegistrySettings::default(),
        &names()
    )
    .is_none());
}

#[test]
fn the_maps_win_where_they_disagree_and_the_journal_keeps_what_they_lack() {
    let agreed = active("10.0.0.1", 7, "veth7");
    let moved = active("10.0.0.2", 7, "veth7");
    let only_journal = active("10.0.0.3", 8, "veth8");
    let mut agreed_flagged = datapath_entry(&agreed);
    agreed_flagged.flags |= FLAG_OBSERVE_ONLY;
    let entries = vec![
        (AddrKey::from(ip("10.0.0.1")), agreed_flagged),
        // The map says veth8 holds .2 now (written after the journal).
        (
            AddrKey::from(ip("10.0.0.2")),
            AddrEntry::new(AddrState::Active, 8, NOW - 5),
        ),
        // Only the map has .4 (the journal was lost with it).
        (
            AddrKey::from(ip("10.0.0.4")),
            AddrEntry::new(AddrState::Quarantined, 0, NOW - 5),
        ),
    ];
    let (merged, adopted) = merge(
        vec![agreed.clone(), moved, only_journal.clone()],
        entries,
        NOW,
        &RegistrySettings::default(),
        &names(),
    );
    let by_addr: BTreeMap<IpAddr, &AddrRecord> = merged.iter().map(|r| (r.addr, r)).collect();
    assert_eq!(by_addr.len(), 4);
    // Agreed: kept with its identity; the map's observe-only flag is kept too.
    assert!(by_addr[&ip("10.0.0.1")].observe_only);
    assert_eq!(
        by_addr[&ip("10.0.0.1")].status.holder(),
        agreed.status.holder()
    );
    // Disagreed: the map's holder.
    assert_eq!(
        by_addr[&ip("10.0.0.2")].status.holder().map(|h| h.ifindex),
        Some(8)
    );
    // The journal's own record the map lacks is kept (maps are lost on reboot).
    assert_eq!(by_addr[&ip("10.0.0.3")], &only_journal);
    assert!(matches!(
        by_addr[&ip("10.0.0.4")].status,
        AddrStatus::Quarantined { .. }
    ));
    assert_eq!(
        adopted,
        vec![ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.4")]
    );
}
