//! The events' fields that became enums are written as the strings they were, byte for byte,
//! and a value a newer agent may send reads as `unknown` instead of failing the whole line.

use serde_json::json;

use super::{Event, EventBody};
use crate::{
    model::{DatapathEntryView, ExhaustedAnswer},
    CheckedMap, DriftFoundBy, EntryState, EventHook, LostPart, OnExhausted, SampleAction,
    SampleReason,
};

fn event(body: EventBody) -> Event {
    Event {
        seq: 7,
        at: "2026-11-27T10:00:00.000Z".into(),
        body,
    }
}

/// Each event as the agent wrote it when these fields were strings, and read back.
#[test]
fn typed_event_fields_are_written_as_the_strings_they_were() {
    let cases = [
        (
            EventBody::Sample {
                address: "10.77.0.2".parse().unwrap(),
                hook: EventHook::TcIngress,
                reason: SampleReason::DuplicateSource,
                action: SampleAction::Observed,
                state: EntryState::Quarantined,
                ifindex: 5,
                seen_on: "vethpa".into(),
                holder_ifindex: 6,
                holder: None,
                src_mac: "02:77:00:00:0a:02".into(),
                pkt_len: 98,
            },
            json!({
                "seq": 7, "at": "2026-11-27T10:00:00.000Z", "type": "sample",
                "address": "10.77.0.2", "hook": "tc_ingress", "reason": "duplicate_source",
                "action": "observed", "state": "quarantined", "ifindex": 5, "seen_on": "vethpa",
                "holder_ifindex": 6, "src_mac": "02:77:00:00:0a:02", "pkt_len": 98,
            }),
        ),
        (
            EventBody::AttachmentLost {
                interface: "/sys/fs/bpf/ipq/IPQ_ADDRS".into(),
                ifindex: 0,
                hook: EventHook::NoHook,
                what: LostPart::Pin,
                repaired: true,
                error: None,
            },
            json!({
                "seq": 7, "at": "2026-11-27T10:00:00.000Z", "type": "attachment_lost",
                "interface": "/sys/fs/bpf/ipq/IPQ_ADDRS", "ifindex": 0, "hook": "none",
                "what": "pin", "repaired": true,
            }),
        ),
        (
            EventBody::MapRewritten {
                map: CheckedMap::IpqQbloom,
                key: "word 3".into(),
                found: "0x0".into(),
                wanted: "0x10".into(),
                repaired: true,
                error: None,
                found_by: Some(DriftFoundBy::ReportedWrite),
            },
            json!({
                "seq": 7, "at": "2026-11-27T10:00:00.000Z", "type": "map_rewritten",
                "map": "IPQ_QBLOOM", "key": "word 3", "found": "0x0", "wanted": "0x10",
                "repaired": true, "found_by": "reported_write",
            }),
        ),
        (
            EventBody::IpamExhausted {
                network: "pods".into(),
                container_id: "c1".into(),
                answer: ExhaustedAnswer {
                    policy: OnExhausted::ReleaseQuietest,
                    quarantined: 1,
                    draining: 0,
                    next_release: None,
                    released: Vec::new(),
                },
            },
            json!({
                "seq": 7, "at": "2026-11-27T10:00:00.000Z", "type": "ipam_exhausted",
                "network": "pods", "container_id": "c1", "policy": "release-quietest",
                "quarantined": 1, "draining": 0,
            }),
        ),
    ];
    for (body, wire) in cases {
        let event = event(body);
        assert_eq!(serde_json::to_value(&event).unwrap(), wire);
        assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), event);
    }
}

/// A line of a newer agent, every typed field a value this build does not know: read, each
/// field `unknown`.
#[test]
fn a_newer_agents_values_read_as_unknown() {
    let sample = json!({
        "seq": 8, "at": "2026-11-27T10:00:00.000Z", "type": "sample", "address": "fd77::2",
        "hook": "tcx_ingress", "reason": "spoofed", "action": "redirected", "state": "parked",
        "ifindex": 5, "holder_ifindex": 6, "src_mac": "02:77:00:00:0a:02", "pkt_len": 98,
    });
    let EventBody::Sample {
        hook,
        reason,
        action,
        state,
        ..
    } = serde_json::from_value::<Event>(sample).unwrap().body
    else {
        panic!("not a sample");
    };
    assert_eq!(
        (hook, reason, action, state),
        (
            EventHook::Unknown,
            SampleReason::Unknown,
            SampleAction::Unknown,
            EntryState::Unknown
        )
    );
    let lost = json!({
        "seq": 9, "at": "2026-11-27T10:00:00.000Z", "type": "attachment_lost",
        "interface": "eth0", "ifindex": 2, "hook": "netkit", "what": "program", "repaired": false,
    });
    let EventBody::AttachmentLost { hook, what, .. } =
        serde_json::from_value::<Event>(lost).unwrap().body
    else {
        panic!("not an attachment_lost");
    };
    assert_eq!((hook, what), (EventHook::Unknown, LostPart::Unknown));
    let rewritten = json!({
        "seq": 10, "at": "2026-11-27T10:00:00.000Z", "type": "map_rewritten",
        "map": "IPQ_ROUTES", "key": "k", "found": "f", "wanted": "w", "repaired": true,
    });
    let EventBody::MapRewritten { map, .. } =
        serde_json::from_value::<Event>(rewritten).unwrap().body
    else {
        panic!("not a map_rewritten");
    };
    assert_eq!(map, CheckedMap::Unknown);
    let answer: ExhaustedAnswer = serde_json::from_value(json!({
        "policy": "evict-oldest", "quarantined": 1, "draining": 0,
    }))
    .unwrap();
    assert_eq!(answer.policy, OnExhausted::Unknown);
}

/// A break-glass answer's state is spelled as before, `unknown` included.
#[test]
fn a_datapath_entry_view_is_written_as_before() {
    for (state, spelled) in [
        (EntryState::Draining, "draining"),
        (EntryState::Unknown, "unknown"),
    ] {
        let view = DatapathEntryView {
            address: "10.77.0.2".parse().unwrap(),
            state,
            holder_ifindex: 5,
            fenced_ifindex: 0,
        };
        let wire = json!({
            "address": "10.77.0.2", "state": spelled, "holder_ifindex": 5, "fenced_ifindex": 0,
        });
        assert_eq!(serde_json::to_value(&view).unwrap(), wire);
        assert_eq!(
            serde_json::from_value::<DatapathEntryView>(wire).unwrap(),
            view
        );
    }
}
