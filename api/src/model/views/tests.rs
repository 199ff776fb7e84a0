use std::net::IpAddr;

use super::AddressView;
use crate::StateName;

/// A free view says the address is free and nothing else: no holder past or present, no
/// time in a state, no conflicts, no protection, no IPAM hold. This is the view the agent has
/// always shown of an address the registry does not hold, field for field.
#[test]
fn a_free_view_says_free_and_nothing_more() {
    let addr: IpAddr = "fd77::9".parse().unwrap();
    let view = AddressView::free(addr);
    assert_eq!(view.address, addr);
    assert_eq!(view.state, StateName::Free);
    assert_eq!(view.holder, None);
    assert_eq!(view.previous_holder, None);
    assert_eq!(view.fenced, None);
    assert_eq!(view.blocked_claimant, None);
    assert!(view.displaced.is_empty());
    assert_eq!(view.since, "");
    assert_eq!(view.until, None);
    assert_eq!(view.last_stale, None);
    assert_eq!(view.conflicts, 0);
    assert_eq!(view.protection, None);
    assert_eq!(view.attachment, None);
    assert!(!view.observe_only);
    assert_eq!(view.last_flush, None);
    assert_eq!(view.ipam_hold, None);
}

/// On the wire a free view is its address, its state, an empty `since` and no conflicts:
/// every optional field is left out.
#[test]
fn a_free_view_on_the_wire_is_address_state_since_and_conflicts() {
    let view = AddressView::free("10.77.0.9".parse().unwrap());
    assert_eq!(
        serde_json::to_value(&view).unwrap(),
        serde_json::json!({
            "address": "10.77.0.9",
            "state": "free",
            "since": "",
            "conflicts": 0,
        })
    );
}

/// The fields that became enums are written as the strings they were: an address's
/// attachment, its IPAM hold's release, its last hygiene pass's trigger and flush (left out
/// when the flush did not finish, as the empty string was).
#[test]
fn typed_names_are_written_as_the_strings_they_were() {
    use super::{HygieneView, IpamHoldView};
    use crate::{Attachment, ConntrackFlush, HoldRelease, HygieneTrigger};
    let address: IpAddr = "10.77.0.9".parse().unwrap();
    let flush = |conntrack_flush| HygieneView {
        address,
        trigger: HygieneTrigger::HolderGone,
        at: String::new(),
        conntrack_entries: 2,
        conntrack_flush,
        neighbours: 0,
        announcements: 0,
        announce_skipped: None,
        skipped: None,
        permanent_neighbours: Vec::new(),
        errors: Vec::new(),
    };
    let view = AddressView {
        attachment: Some(Attachment::TcxAndNetlink),
        last_flush: Some(flush(Some(ConntrackFlush::Kernel))),
        ipam_hold: Some(IpamHoldView {
            network: "pods".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            release: HoldRelease::AfterQuarantine,
            error: None,
        }),
        ..AddressView::free(address)
    };
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["attachment"], "tcx+netlink");
    assert_eq!(json["ipam_hold"]["release"], "after the quarantine");
    assert_eq!(json["last_flush"]["trigger"], "holder_gone");
    assert_eq!(json["last_flush"]["conntrack_flush"], "kernel");
    let unfinished = serde_json::to_value(flush(None)).unwrap();
    assert!(unfinished.get("conntrack_flush").is_none(), "{unfinished}");
    let back: HygieneView = serde_json::from_value(unfinished).unwrap();
    assert_eq!(back.conntrack_flush, None);
}
