//! What one address costs: the per-address types stay small (a registry holds one record per
//! address, 65536 by default), and their JSON stays what journals and API clients of earlier
//! agents wrote and read.

use super::*;

/// The JSON of a fully contested record, as agents before the compact layout wrote it.
const CONTESTED_JSON: &str = r#"{"addr":"10.0.0.1","state":"quarantined","since":5,"until":9,"last_stale":7,"previous":{"ifindex":7,"ifname":"veth7","container_id":"c0ffee","cni_ifname":"eth0","network":"net","netns":"/run/netns/x","pod":{"namespace":"ns","name":"web-0","uid":"u1"}},"fenced":{"ifindex":8,"ifname":"veth8"},"blocked_claimant":{"ifindex":7,"ifname":"veth7","container_id":"c0ffee","cni_ifname":"eth0","network":"net","netns":"/run/netns/x","pod":{"namespace":"ns","name":"web-0","uid":"u1"}},"displaced":[{"ifindex":9,"ifname":"veth9"},{"ifindex":7,"ifname":"veth7","container_id":"c0ffee","cni_ifname":"eth0","network":"net","netns":"/run/netns/x","pod":{"namespace":"ns","name":"web-0","uid":"u1"}}],"conflicts":3,"observe_only":true}"#;
/// The JSON of a record known only from netlink, as those agents wrote it.
const BARE_JSON: &str = r#"{"addr":"fd00::1","state":"active","holder":{"ifindex":3,"ifname":"bw3"},"since":11,"conflicts":0}"#;

fn full_holder() -> Holder {
    Holder::new(7, "veth7")
        .with_container_id("c0ffee")
        .with_cni_ifname("eth0")
        .with_network("net")
        .with_netns("/run/netns/x")
        .with_pod(PodRef {
            namespace: "ns".into(),
            name: "web-0".into(),
            uid: Some("u1".into()),
        })
}

fn contested() -> AddrRecord {
    let mut r = AddrRecord::new(
        ip("10.0.0.1"),
        AddrStatus::Quarantined {
            since: 5,
            until: 9,
            last_stale: Some(7),
            previous: full_holder(),
        },
    );
    r.fence(Holder::new(9, "veth9"));
    r.fence(Holder::new(8, "veth8"));
    r.displace(full_holder());
    r.contest.replace_blocked_claimant(full_holder());
    r.conflicts = 3;
    r.observe_only = true;
    r
}

#[test]
fn the_per_address_types_stay_small() {
    // A bare holder is its interface; identity lives out of line. A record keeps the rarely
    // used holders (fenced, blocked, displaced) out of line too. Growing either multiplies by
    // the registry's size: at 65536 addresses every 8 bytes here cost about 0.5 MB of RSS
    // (each record is a box of its own, see `records.rs`).
    assert!(
        size_of::<Holder>() <= 40,
        "Holder: {} bytes",
        size_of::<Holder>()
    );
    assert!(
        size_of::<AddrRecord>() <= 104,
        "AddrRecord: {} bytes",
        size_of::<AddrRecord>()
    );
}

#[test]
fn records_write_the_json_earlier_agents_wrote() {
    assert_eq!(serde_json::to_string(&contested()).unwrap(), CONTESTED_JSON);
    let bare = AddrRecord::new(
        ip("fd00::1"),
        AddrStatus::Active {
            holder: Holder::new(3, "bw3"),
            since: 11,
        },
    );
    assert_eq!(serde_json::to_string(&bare).unwrap(), BARE_JSON);
}

#[test]
fn records_read_the_json_earlier_agents_wrote() {
    let read: AddrRecord = serde_json::from_str(CONTESTED_JSON).unwrap();
    assert_eq!(read, contested());
    assert_eq!(read.fenced(), Some(&Holder::new(8, "veth8")));
    assert_eq!(read.displaced(), [Holder::new(9, "veth9"), full_holder()]);
    assert_eq!(
        read.blocked_claimant().and_then(Holder::network),
        Some("net")
    );
    let bare: AddrRecord = serde_json::from_str(BARE_JSON).unwrap();
    assert_eq!((bare.fenced(), bare.displaced()), (None, &[][..]));
}

#[test]
fn equal_records_are_equal_whatever_path_they_took() {
    // A contest that emptied, or an identity whose fields were all absent, leaves no box
    // behind: equality (and so the registry's change detection) sees no difference.
    let mut record = AddrRecord::new(
        ip("10.0.0.2"),
        AddrStatus::Active {
            holder: h(3),
            since: 1,
        },
    );
    let fresh = record.clone();
    record.fence(h(4));
    record.contest.unfence(&h(4));
    assert_eq!(record, fresh);
    let empty = Holder::new(3, "veth3").with_identity(None, None, None, None, None);
    assert_eq!(empty, h(3));
    let read: Holder = serde_json::from_str(r#"{"ifindex":3,"ifname":"veth3"}"#).unwrap();
    assert_eq!(read, h(3));
}
