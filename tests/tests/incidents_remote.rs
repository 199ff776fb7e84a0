//! Incident (e), classic Swarm #1488, replayed across "nodes": another machine on the uplink's
//! layer 2 (the peer namespace, directly wired to up0) starts using an address a pod here
//! still has, and announces it the way a booting container's stack does: a gratuitous ARP for
//! IPv4, an unsolicited neighbour advertisement for IPv6. The frames are crafted here and sent
//! through an AF_PACKET socket in the peer, so no arping/ndisc6 is needed.
//!
//! The announcement is a `remote_claim` conflict and the local pod is fenced, its packets
//! dropped both ways: while it is Draining, and while it is Active under the default
//! `on_early_reuse = fence-old` (an Active holder claimed elsewhere is the stale one: a cluster
//! IPAM freed its address while it runs, docs/design.md "Remote claim"; under `refuse-new` and
//! `observe` it would only be reported, the registry's unit tests cover that).
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use ipq_tests::{
    lab::{
        ifindex, mac_bytes, map_entry as entry, poll, send_frames, udp_burst, udp_burst_with,
        wait_for_entry, Agent, Lab, UdpSender, PEER_LLADDR, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6,
        POD_B_V4, POD_B_V6,
    },
    netns::NetNs,
};

const N: usize = 20;
const SETTLE: Duration = Duration::from_secs(5);

/// The Internet checksum of `parts`, concatenated.
fn checksum(parts: &[&[u8]]) -> u16 {
    ipq_tests::packets::checksum(&parts.concat())
}

/// An unsolicited neighbour advertisement from `mac` (link-local `src`) to all nodes:
/// override set, solicited clear, target `addr`, with its target link-layer address option.
fn unsolicited_na(mac: [u8; 6], src: Ipv6Addr, addr: Ipv6Addr) -> Vec<u8> {
    let all_nodes: Ipv6Addr = "ff02::1".parse().expect("valid");
    let mut icmp = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
    icmp.extend_from_slice(&addr.octets());
    icmp.extend_from_slice(&[2, 1]);
    icmp.extend_from_slice(&mac);
    let length = (icmp.len() as u32).to_be_bytes();
    let sum = checksum(&[
        &src.octets(),
        &all_nodes.octets(),
        &length,
        &[0, 0, 0, 58],
        &icmp,
    ]);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut frame = vec![0x33, 0x33, 0, 0, 0, 1];
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&0x86ddu16.to_be_bytes());
    frame.extend_from_slice(&[0x60, 0, 0, 0]);
    frame.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    frame.extend_from_slice(&[58, 255]);
    frame.extend_from_slice(&src.octets());
    frame.extend_from_slice(&all_nodes.octets());
    frame.extend_from_slice(&icmp);
    frame
}

/// The peer announces `addrs` on the uplink's wire as a host taking them over would.
fn announce(peer: &NetNs, addrs: &[IpAddr]) {
    let mac = mac_bytes(PEER_LLADDR);
    // The peer's EUI-64 link-local address.
    let src: Ipv6Addr = "fe80::78:ff:fe00:2".parse().expect("valid");
    let frames: Vec<Vec<u8>> = addrs
        .iter()
        .map(|addr| match addr {
            IpAddr::V4(a) => ipq_tests::packets::gratuitous_arp(mac, *a),
            IpAddr::V6(a) => unsolicited_na(mac, src, *a),
        })
        .collect();
    send_frames(peer, "eth0", &frames).expect("sending the announcements");
}

fn wait_conflicts(agent: &Agent, kind: &str, want: f64) {
    poll(&format!("{want} {kind} conflicts"), SETTLE, || {
        let got = agent
            .scrape()?
            .get("ipq_conflicts_total", &[("kind", kind)]);
        Ok(got.ok().filter(|v| *v == want))
    })
    .unwrap_or_else(|e| panic!("{e:#}\nlog:\n{}", agent.log()));
}

/// What a pod gets through with `addr`: (to the peer, from the peer).
fn traffic(lab: &Lab, pod: &NetNs, addr: IpAddr, peer: IpAddr) -> (usize, usize) {
    let out = udp_burst_with(
        pod,
        UdpSender {
            bind: Some(addr),
            device: None,
        },
        &lab.peer,
        peer,
        N,
    );
    (out, udp_burst(&lab.peer, pod, addr, N))
}

/// (e) The peer announces pod b's addresses while pod b is Active here: two `remote_claim`
/// conflicts, and pod b fenced (fence-old), its packets dropped both ways. Then pod a's routes are
/// withdrawn (Draining; it still flows, through policy routes outside the main table) and the
/// peer announces pod a's addresses: two more `remote_claim` conflicts and pod a is fenced,
/// its packets dropped both ways.
#[test]
fn swarm_1488_remote_claim_fences_a_draining_and_an_active_holder() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&["--workload", "vethp*", "--uplink", "up0"])
        .expect("starting ipq-agent");
    let vethpa = ifindex(&lab.node, "vethpa").expect("vethpa");
    let vethpb = ifindex(&lab.node, "vethpb").expect("vethpb");
    let pod_a = [IpAddr::from(POD_A_V4), POD_A_V6.into()];
    let pod_b = [IpAddr::from(POD_B_V4), POD_B_V6.into()];
    for addr in pod_a {
        wait_for_entry(&lab, addr, &entry("active", vethpa, 0), SETTLE);
    }
    for addr in pod_b {
        wait_for_entry(&lab, addr, &entry("active", vethpb, 0), SETTLE);
    }
    let peers = [IpAddr::from(PEER_V4), PEER_V6.into()];

    // Pod b is Active: the remote claim is reported and pod b fenced (fence-old).
    let before = agent.scrape().expect("scrape");
    announce(&lab.peer, &pod_b);
    wait_conflicts(&agent, "remote_claim", 2.0);
    for addr in pod_b {
        assert_eq!(
            agent.conflicts_logged("remote_claim", addr),
            1,
            "remote_claim conflicts logged for {addr}; log:\n{}",
            agent.log()
        );
        wait_for_entry(&lab, addr, &entry("active", vethpb, vethpb), SETTLE);
    }
    for (addr, peer) in pod_b.into_iter().zip(peers) {
        assert_eq!(
            traffic(&lab, &lab.pod_b, addr, peer),
            (0, 0),
            "{addr}: Active pod b, claimed remotely, is fenced (out, in)"
        );
    }
    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::from([
            ("hook=tc_egress,reason=fenced".to_owned(), (2 * N) as f64),
            ("hook=tc_ingress,reason=fenced".to_owned(), (2 * N) as f64),
        ]),
        "pod b's packets dropped both ways, both families"
    );
    assert_eq!(
        after.changes_since(&before, "ipq_reported_packets_total"),
        BTreeMap::from([("hook=xdp,reason=remote_claim".to_owned(), 2.0)]),
        "the two announcements reported at the uplink"
    );
    assert_eq!(
        after.changes_since(&before, "ipq_conflicts_total"),
        BTreeMap::from([("kind=remote_claim".to_owned(), 2.0)]),
        "conflicts"
    );

    // Pod a terminates; policy routes (outside the main table) keep it reachable.
    lab.routes()
        .route_to_via_table("vethpa", 101, &pod_a)
        .expect("policy routes to pod a");
    for addr in pod_a {
        lab.routes()
            .del_host_route("vethpa", addr)
            .expect("withdrawing");
        wait_for_entry(&lab, addr, &entry("draining", vethpa, 0), SETTLE);
    }
    for (addr, peer) in pod_a.into_iter().zip(peers) {
        assert_eq!(
            traffic(&lab, &lab.pod_a, addr, peer),
            (N, N),
            "{addr}: Draining pod a flows before any remote claim (out, in)"
        );
    }

    // Another machine takes pod a's addresses over and announces them.
    let before = agent.scrape().expect("scrape");
    announce(&lab.peer, &pod_a);
    wait_conflicts(&agent, "remote_claim", 4.0);
    for addr in pod_a {
        wait_for_entry(&lab, addr, &entry("draining", vethpa, vethpa), SETTLE);
        assert_eq!(
            agent.conflicts_logged("remote_claim", addr),
            1,
            "remote_claim conflicts logged for {addr}; log:\n{}",
            agent.log()
        );
    }
    for (addr, peer) in pod_a.into_iter().zip(peers) {
        assert_eq!(
            traffic(&lab, &lab.pod_a, addr, peer),
            (0, 0),
            "{addr}: Draining pod a, claimed remotely, is fenced (out, in)"
        );
    }
    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::from([
            ("hook=tc_egress,reason=fenced".to_owned(), (2 * N) as f64),
            ("hook=tc_ingress,reason=fenced".to_owned(), (2 * N) as f64),
        ]),
        "pod a's packets dropped both ways, both families"
    );
    assert_eq!(
        after.changes_since(&before, "ipq_conflicts_total"),
        BTreeMap::from([("kind=remote_claim".to_owned(), 2.0)]),
        "conflicts"
    );
}
