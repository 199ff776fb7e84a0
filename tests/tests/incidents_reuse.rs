//! Incidents of address reuse replayed with real traffic (DESIGN §1, issue 3):
//!
//! - (a) SwarmKit #2407: a terminating pod's address handed to a new pod (early reuse);
//! - (b) whereabouts: two live pods given the same address, under each `on_early_reuse` policy;
//! - (d) `refuse-new` with a claim seen only on netlink: the new pod waits for the old one to go.
//!
//! Each test builds its own lab (namespaces node, pod-a, pod-b, peer) and runs the real
//! `ipq-agent` in it. Pods are reached from the node through their own veth with sockets bound
//! to that veth (policy routes outside the main table, which the agent does not read), so a
//! pod is tested both ways whatever the main table says about its address.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use ipq_tests::lab::{
    map_entry as entry, pod_a_and_peer, poll, udp_burst, udp_burst_with, wait_claimed_at_start,
    wait_for_entry, Agent, Lab, UdpSender, POD_A_V4, POD_A_V6, POD_B_LLADDR,
};

/// Datagrams per burst.
const N: usize = 20;
/// How long the agent may take to act on a netlink event.
const SETTLE: Duration = Duration::from_secs(5);

/// Routing tables of the node sockets bound to vethpa / vethpb.
const TABLE_VIA_A: u32 = 101;
const TABLE_VIA_B: u32 = 102;

fn args(policy: &str) -> Vec<&str> {
    vec![
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--on-early-reuse",
        policy,
    ]
}

/// Waits until `ipq_conflicts_total{kind}` reaches `want`.
fn wait_conflicts(agent: &Agent, kind: &str, want: f64) {
    poll(&format!("{want} {kind} conflicts"), SETTLE, || {
        let got = agent
            .scrape()?
            .get("ipq_conflicts_total", &[("kind", kind)]);
        Ok(got.ok().filter(|v| *v == want))
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Waits until the agent logged `want` conflicts of `kind` for `addr`, then checks it stays
/// at exactly that.
fn assert_conflicts_logged(agent: &Agent, kind: &str, addr: IpAddr, want: usize) {
    poll(
        &format!("{want} {kind} conflict(s) logged for {addr}"),
        SETTLE,
        || Ok((agent.conflicts_logged(kind, addr) >= want).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\nlog:\n{}", agent.log()));
    assert_eq!(
        agent.conflicts_logged(kind, addr),
        want,
        "{kind} conflicts logged for {addr}; log:\n{}",
        agent.log()
    );
}

/// What one pod gets through with `addr`: (to the peer, from the node through its own veth).
fn pod_traffic(lab: &Lab, pod: &str, addr: IpAddr, peer: IpAddr) -> (usize, usize) {
    let (ns, veth) = match pod {
        "a" => (&lab.pod_a, "vethpa"),
        _ => (&lab.pod_b, "vethpb"),
    };
    ipq_tests::lab::pod_traffic(lab, ns, veth, addr, peer, N)
}

fn fenced_drops(n: usize) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("hook=tc_egress,reason=fenced".to_owned(), n as f64),
        ("hook=tc_ingress,reason=fenced".to_owned(), n as f64),
    ])
}

/// (a) Pod a terminates (its route withdrawn, its process still sending) and its address is
/// given to pod b at once. Under `fence-old`, pod a's packets with that address are dropped
/// both ways at vethpa, pod b's flow both ways, and exactly one `early_reuse` conflict is
/// recorded per address; IPv4 and IPv6.
#[test]
fn swarmkit_2407_early_reuse_fences_the_terminating_pod_both_ways_and_the_new_pod_flows() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&args("fence-old"))
        .expect("starting ipq-agent");
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);
    lab.routes()
        .route_by_oif("vethpa", TABLE_VIA_A, &[POD_A_V4.into(), POD_A_V6.into()])
        .expect("policy routes through vethpa");

    for (addr, peer) in pod_a_and_peer() {
        // Pod a terminates: its route is withdrawn while its process still runs.
        lab.routes()
            .del_host_route("vethpa", addr)
            .expect("withdrawing");
        wait_for_entry(&lab, addr, &entry("draining", vethpa, 0), SETTLE);
        let before = agent.scrape().expect("scrape");
        assert_eq!(
            udp_burst_with(
                &lab.pod_a,
                UdpSender {
                    bind: Some(addr),
                    device: None
                },
                &lab.peer,
                peer,
                N
            ),
            N,
            "{addr}: pod a, draining and alone, still gets through to {peer}"
        );
        assert_eq!(
            agent
                .scrape()
                .expect("scrape")
                .changes_since(&before, "ipq_dropped_packets_total"),
            BTreeMap::new(),
            "{addr}: nothing is dropped while pod a drains alone"
        );

        // The orchestrator hands the address to pod b at once.
        let before = agent.scrape().expect("scrape");
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("giving pod b the address");
        lab.routes()
            .add_host_route("vethpb", addr, None)
            .expect("pod b's host route");
        wait_for_entry(&lab, addr, &entry("active", vethpb, vethpa), SETTLE);

        let (a_out, a_in) = pod_traffic(&lab, "a", addr, peer);
        let b_out = udp_burst_with(
            &lab.pod_b,
            UdpSender {
                bind: Some(addr),
                device: None,
            },
            &lab.peer,
            peer,
            N,
        );
        let b_in = udp_burst(&lab.peer, &lab.pod_b, addr, N);
        assert_eq!(
            (a_out, a_in),
            (0, 0),
            "{addr}: old pod a (to the peer, from the node) must get nothing through"
        );
        assert_eq!(
            (b_out, b_in),
            (N, N),
            "{addr}: new pod b (to the peer, from the peer) must get everything through"
        );

        let after = agent.scrape().expect("scrape");
        assert_eq!(
            after.changes_since(&before, "ipq_dropped_packets_total"),
            fenced_drops(N),
            "{addr}: drops (pod a's {N} out at tc_ingress, {N} in at tc_egress)"
        );
        assert_eq!(
            after.changes_since(&before, "ipq_conflicts_total"),
            BTreeMap::from([("kind=early_reuse".to_owned(), 1.0)]),
            "{addr}: conflicts recorded"
        );
        assert_conflicts_logged(&agent, "early_reuse", addr, 1);
    }
}

/// (b) whereabouts: pod b is given pod a's address while pod a lives on. Before pod b's route
/// exists its packets with that address are duplicate sources (dropped, a conflict); then its
/// host route (a second one, metric 2000) is a claim over a live holder: an `early_reuse`
/// conflict, resolved by `policy`: pod a gets through both ways iff `a_through`, pod b iff
/// `b_through`, and what does not get through is dropped as fenced and counted.
fn whereabouts_duplicate(policy: &str, a_through: bool, b_through: bool) {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&args(policy)).expect("starting ipq-agent");
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);
    let all = [POD_A_V4.into(), POD_A_V6.into()];
    lab.routes()
        .route_by_oif("vethpa", TABLE_VIA_A, &all)
        .expect("policy routes through vethpa");
    lab.routes()
        .route_by_oif("vethpb", TABLE_VIA_B, &all)
        .expect("policy routes through vethpb");

    // The IPAM hands pod a's addresses to pod b too; pod b sends before its route exists.
    for (addr, peer) in pod_a_and_peer() {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("giving pod b the address");
        let before = agent.scrape().expect("scrape");
        let got = udp_burst_with(
            &lab.pod_b,
            UdpSender {
                bind: Some(addr),
                device: None,
            },
            &lab.peer,
            peer,
            N,
        );
        assert_eq!(
            got, 0,
            "{addr}: pod b, not its holder, sends as a duplicate source"
        );
        assert_eq!(
            pod_traffic(&lab, "a", addr, peer),
            (N, N),
            "{addr}: pod a, its holder, is untouched"
        );
        let after = agent.scrape().expect("scrape");
        assert_eq!(
            after.changes_since(&before, "ipq_dropped_packets_total"),
            BTreeMap::from([(
                "hook=tc_ingress,reason=duplicate_source".to_owned(),
                N as f64
            )]),
            "{addr}: drops of pod b's packets"
        );
        assert_conflicts_logged(&agent, "duplicate_source", addr, 1);
    }
    wait_conflicts(&agent, "duplicate_source", 2.0);

    // Its CNI installs pod b's host route next to pod a's: a claim over a live holder.
    let before = agent.scrape().expect("scrape");
    for (addr, _) in pod_a_and_peer() {
        lab.routes()
            .add_host_route("vethpb", addr, Some(2000))
            .expect("pod b's host route");
    }
    wait_conflicts(&agent, "early_reuse", 2.0);
    for (addr, _) in pod_a_and_peer() {
        assert_conflicts_logged(&agent, "early_reuse", addr, 1);
        match policy {
            "fence-old" => wait_for_entry(&lab, addr, &entry("active", vethpb, vethpa), SETTLE),
            "refuse-new" => wait_for_entry(&lab, addr, &entry("active", vethpa, vethpb), SETTLE),
            _ => {}
        }
    }

    let mut dropped = 0;
    for (addr, peer) in pod_a_and_peer() {
        let a = pod_traffic(&lab, "a", addr, peer);
        let b = pod_traffic(&lab, "b", addr, peer);
        let want = |through: bool| if through { (N, N) } else { (0, 0) };
        assert_eq!(
            (a, b),
            (want(a_through), want(b_through)),
            "{addr} under {policy}: (pod a, pod b) deliveries (to the peer, from the node)"
        );
        dropped += [a_through, b_through].iter().filter(|t| !**t).count() * N;
    }
    let after = agent.scrape().expect("scrape");
    let drops = if dropped == 0 {
        BTreeMap::new()
    } else {
        fenced_drops(dropped)
    };
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        drops,
        "drops under {policy} after pod b's claim"
    );
    assert_eq!(
        after.changes_since(&before, "ipq_conflicts_total"),
        BTreeMap::from([("kind=early_reuse".to_owned(), 2.0)]),
        "conflicts under {policy} after pod b's claim (one per address)"
    );
}

/// (b) `fence-old`: the second pod (b) gets through, the first (a) is fenced both ways.
#[test]
fn whereabouts_duplicate_under_fence_old_lets_the_second_pod_through() {
    whereabouts_duplicate("fence-old", false, true);
}

/// (b) `refuse-new`: the first pod (a) keeps the address, the second (b) is blocked both ways.
#[test]
fn whereabouts_duplicate_under_refuse_new_keeps_the_first_pod_and_blocks_the_second() {
    whereabouts_duplicate("refuse-new", true, false);
}

/// (b) `observe`: the conflict is recorded, nothing is dropped: both pods get through.
#[test]
fn whereabouts_duplicate_under_observe_records_the_conflict_and_lets_both_through() {
    whereabouts_duplicate("observe", true, true);
}

/// (d) `refuse-new`, with pod b's claim seen only on netlink (a host route, no CNI call):
/// pod b's traffic is dropped both ways while pod a holds the address and flows; once pod a's
/// interface is deleted, pod b's traffic flows both ways with no other action.
#[test]
fn refuse_new_blocks_a_netlink_claimant_until_the_old_holder_is_gone_then_lets_it_through() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&args("refuse-new"))
        .expect("starting ipq-agent");
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);
    let all = [POD_A_V4.into(), POD_A_V6.into()];
    lab.routes()
        .route_by_oif("vethpb", TABLE_VIA_B, &all)
        .expect("policy routes through vethpb");

    let before = agent.scrape().expect("scrape");
    for (addr, _) in pod_a_and_peer() {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("giving pod b the address");
        lab.routes()
            .add_host_route("vethpb", addr, Some(2000))
            .expect("pod b's host route");
        wait_for_entry(&lab, addr, &entry("active", vethpa, vethpb), SETTLE);
    }
    for (addr, peer) in pod_a_and_peer() {
        let a_out = udp_burst_with(
            &lab.pod_a,
            UdpSender {
                bind: Some(addr),
                device: None,
            },
            &lab.peer,
            peer,
            N,
        );
        // The main table still sends the address to pod a (its route has the lower metric).
        let a_in = udp_burst(&lab.peer, &lab.pod_a, addr, N);
        let b = pod_traffic(&lab, "b", addr, peer);
        assert_eq!((a_out, a_in), (N, N), "{addr}: pod a, the holder, flows");
        assert_eq!(b, (0, 0), "{addr}: pod b, the refused claimant, is blocked");
    }
    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        fenced_drops(2 * N),
        "drops of pod b's traffic (both families, both ways)"
    );
    assert_eq!(
        after.changes_since(&before, "ipq_conflicts_total"),
        BTreeMap::from([("kind=early_reuse".to_owned(), 2.0)]),
        "conflicts"
    );

    // Pod a goes away; nothing else is done.
    lab.node
        .ip(&["link", "del", "vethpa"])
        .expect("deleting vethpa");
    for (addr, _) in pod_a_and_peer() {
        wait_for_entry(&lab, addr, &entry("active", vethpb, 0), SETTLE);
    }
    let before = agent.scrape().expect("scrape");
    for (addr, peer) in pod_a_and_peer() {
        let b_out = udp_burst_with(
            &lab.pod_b,
            UdpSender {
                bind: Some(addr),
                device: None,
            },
            &lab.peer,
            peer,
            N,
        );
        // Pod b's route is now the only one: the peer reaches it through the main table.
        let b_in = udp_burst(&lab.peer, &lab.pod_b, addr, N);
        assert_eq!(
            (b_out, b_in),
            (N, N),
            "{addr}: pod b flows once pod a is gone"
        );
    }
    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::new(),
        "nothing dropped once pod b holds the addresses"
    );
    assert_eq!(
        after
            .get("ipq_addresses", &[("state", "quarantined")])
            .unwrap(),
        0.0,
        "pod b took the addresses over: none is quarantined"
    );
}
