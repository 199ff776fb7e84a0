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
fn the_stricter_wins_where_they_disagree_and_the_journal_keeps_what_the_maps_lack() {
    let agreed = active("10.0.0.1", 7, "veth7");
    let moved = active("10.0.0.2", 7, "veth7");
    let only_journal = active("10.0.0.3", 8, "veth8");
    let fenced_in_journal = active("10.0.0.5", 7, "veth7");
    let mut fenced_in_journal_record = fenced_in_journal.clone();
    fenced_in_journal_record
        .contest
        .set_fenced(Some(Holder::new(8, "veth8")));
    let fenced_in_map = active("10.0.0.6", 7, "veth7");
    let mut agreed_flagged = datapath_entry(&agreed);
    agreed_flagged.flags |= FLAG_OBSERVE_ONLY;
    let entries = vec![
        (AddrKey::from(ip("10.0.0.1")), agreed_flagged),
        // The map says veth8 holds .2 (a tie in strictness: the journal's record stays).
        (
            AddrKey::from(ip("10.0.0.2")),
            AddrEntry::new(AddrState::Active, 8, NOW - 5),
        ),
        // Only the map has .4 (the journal was lost with it): quarantined over free.
        (
            AddrKey::from(ip("10.0.0.4")),
            AddrEntry::new(AddrState::Quarantined, 0, NOW - 5),
        ),
        // Another process unfenced .5 in the map: the journal's fence stays.
        (
            AddrKey::from(ip("10.0.0.5")),
            AddrEntry::new(AddrState::Active, 7, NOW - 10),
        ),
        // The map fenced .6 after the journal was written (killed between the writes).
        (
            AddrKey::from(ip("10.0.0.6")),
            AddrEntry::new(AddrState::Active, 7, NOW - 5).with_fenced(7),
        ),
    ];
    let (merged, adopted, disagreeing) = merge(
        vec![
            agreed.clone(),
            moved,
            only_journal.clone(),
            fenced_in_journal_record.clone(),
            fenced_in_map,
        ],
        entries,
        NOW,
        &RegistrySettings::default(),
        &names(),
    );
    let by_addr: BTreeMap<IpAddr, &AddrRecord> = merged.iter().map(|r| (r.addr, r)).collect();
    assert_eq!(by_addr.len(), 6);
    // Agreed: kept with its identity; the map's observe-only flag is kept too.
    assert!(by_addr[&ip("10.0.0.1")].observe_only);
    assert_eq!(
        by_addr[&ip("10.0.0.1")].status.holder(),
        agreed.status.holder()
    );
    // A tie: the journal's holder, never a map's that enforces no more.
    assert_eq!(
        by_addr[&ip("10.0.0.2")].status.holder().map(|h| h.ifindex),
        Some(7)
    );
    // The journal's own record the map lacks is kept (maps are lost on reboot).
    assert_eq!(by_addr[&ip("10.0.0.3")], &only_journal);
    assert!(matches!(
        by_addr[&ip("10.0.0.4")].status,
        AddrStatus::Quarantined { .. }
    ));
    // Fenced over unfenced, whichever copy has the fence.
    assert_eq!(by_addr[&ip("10.0.0.5")], &fenced_in_journal_record);
    assert_eq!(datapath_entry(by_addr[&ip("10.0.0.6")]).fenced_ifindex, 7);
    assert_eq!(
        adopted,
        vec![ip("10.0.0.1"), ip("10.0.0.4"), ip("10.0.0.6")]
    );
    // Every disagreement is reported, whichever way it went.
    assert_eq!(disagreeing.len(), 3, "{disagreeing:#?}");
    assert!(
        disagreeing[0].starts_with("10.0.0.2: ") && disagreeing[0].contains("kept the journal's")
    );
    assert!(
        disagreeing[1].starts_with("10.0.0.5: ") && disagreeing[1].contains("kept the journal's")
    );
    assert!(
        disagreeing[2].starts_with("10.0.0.6: ") && disagreeing[2].contains("adopted the maps'")
    );
}
