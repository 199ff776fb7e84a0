//! The netns labs of the kernel tier (`cargo xtask test-kernels`, which runs them on Debian's
//! 5.10, 6.1 and 6.12 under QEMU; the host suite runs them too). Each checks one thing the
//! datapath must do on every kernel ipq supports, whichever way its programs are attached
//! (TCX links or netlink cls_bpf filters):
//!
//! - stale traffic for a gone pod's address is dropped at the uplink's XDP hook, v4 and v6;
//! - a pod sending with another pod's address (the duplicate source) is dropped at TC ingress
//!   while the holder flows, v4 and v6;
//! - SIGKILL of the agent under traffic delivers none of a fenced pod's packets, before,
//!   during or after the restart, and the restarted agent re-adopts each attachment: exactly
//!   one per hook, the same one;
//! - the reuse-hygiene probe gives this kernel's answer (the kernel's filtered conntrack flush
//!   refused before 6.12; from 6.12 honoured for IPv4 and inverted for IPv6), and a claim is
//!   flushed the way it chose, without errors.
//!
//! The fenced holder dropped both ways is `traffic.rs`'s enforce test, which the tier runs too.
//! Timeouts scale with `IPQ_TEST_TIME_SCALE` (see `ipq_tests::time`).
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use aya::programs::TcAttachType;
use ipq_tests::{
    attach::wait_tc_upgrades,
    attachments::{self, Attachment},
    lab::{
        map_entry as entry, pod_a_and_peer, udp_burst_with, wait_claimed_at_start, wait_for_entry,
        Lab, UdpSender, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_LLADDR, POD_B_V6,
    },
    netns::NetNs,
    time::scaled,
};

const N: usize = 20;
const SETTLE: Duration = Duration::from_secs(5);

/// `n` datagrams from `from` (bound to `bind`) to `dst` in `to`: how many arrived.
fn send(from: &NetNs, bind: IpAddr, to: &NetNs, dst: IpAddr, n: usize) -> usize {
    let sender = UdpSender {
        bind: Some(bind),
        device: None,
    };
    udp_burst_with(from, sender, to, dst, n)
}

/// Pod a is gone (its veth deleted) and its addresses quarantined; the peer keeps sending to
/// them. Every datagram is dropped at the uplink's XDP hook as stale traffic, and nothing
/// else is dropped.
#[test]
fn stale_traffic_for_a_gone_pod_is_dropped_at_the_uplink_xdp_hook() {
    let lab = Lab::new().expect("building the lab");
    // A cool-down far longer than the test: the quarantine must hold throughout.
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--cooldown",
        "10m",
        "--max-cooldown",
        "10m",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    wait_claimed_at_start(&lab, SETTLE);
    lab.node
        .ip(&["link", "del", "vethpa"])
        .expect("deleting vethpa");
    for (addr, _) in pod_a_and_peer() {
        wait_for_entry(&lab, addr, &entry("quarantined", 0, 0), SETTLE);
    }

    let before = agent.scrape().expect("scrape");
    for (addr, peer) in pod_a_and_peer() {
        let got = send(&lab.peer, peer, &lab.pod_a, addr, N);
        assert_eq!(got, 0, "stale traffic to {addr} delivered {got} of {N}");
    }
    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::from([("hook=xdp,reason=stale_traffic".to_owned(), (2 * N) as f64)]),
        "every stale datagram (v4 and v6) dropped at the uplink, nothing else"
    );
}

/// Pod b is given pod a's addresses (as a duplicate IPAM would) and sends with them while
/// pod a holds them: pod b's packets are dropped at TC ingress as a duplicate source, pod a's
/// pass, v4 and v6.
#[test]
fn a_duplicate_source_is_dropped_at_tc_ingress_while_the_holder_flows() {
    let lab = Lab::new().expect("building the lab");
    let args = ["--workload", "vethp*", "--uplink", "up0"];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    wait_claimed_at_start(&lab, SETTLE);
    for (addr, peer) in pod_a_and_peer() {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("giving pod b the address");
        let before = agent.scrape().expect("scrape");
        let from_b = send(&lab.pod_b, addr, &lab.peer, peer, N);
        assert_eq!(
            from_b, 0,
            "{addr}: pod b, not its holder, got {from_b} through"
        );
        let from_a = send(&lab.pod_a, addr, &lab.peer, peer, N);
        assert_eq!(
            from_a, N,
            "{addr}: pod a, its holder, got {from_a} of {N} through"
        );
        let after = agent.scrape().expect("scrape");
        assert_eq!(
            after.changes_since(&before, "ipq_dropped_packets_total"),
            BTreeMap::from([(
                "hook=tc_ingress,reason=duplicate_source".to_owned(),
                N as f64
            )]),
            "{addr}: drops of pod b's datagrams"
        );
    }
}

/// One flow sent at a steady pace for as long as `stop` is false: (sent, received).
fn stream(from: &NetNs, to: &NetNs, dst: IpAddr, stop: &AtomicBool) -> (usize, usize) {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let rx = to
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a receiver in {}: {e}", to.name()));
    rx.set_nonblocking(true).expect("non-blocking receiver");
    let port = rx.local_addr().expect("bound").port();
    let tx = from
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a sender in {}: {e}", from.name()));
    let tag = format!("kernel-tier {dst} {port}");
    let (mut sent, mut received) = (0, 0);
    let mut buf = [0u8; 256];
    let mut drain = |received: &mut usize| loop {
        match rx.recv(&mut buf) {
            Ok(len) if buf[..len].starts_with(tag.as_bytes()) => *received += 1,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("receiving in {}: {e}", to.name()),
        }
    };
    while !stop.load(Ordering::Relaxed) {
        tx.send_to(tag.as_bytes(), (dst, port))
            .unwrap_or_else(|e| panic!("sending to {dst} from {}: {e}", from.name()));
        sent += 1;
        drain(&mut received);
        std::thread::sleep(Duration::from_millis(5));
    }
    // Delivery on veths is synchronous; one last look after a pause catches stragglers.
    std::thread::sleep(scaled(Duration::from_millis(200)));
    drain(&mut received);
    (sent, received)
}

/// Every hook of the lab and what is attached there.
fn hooks(lab: &Lab) -> BTreeMap<String, Vec<Attachment>> {
    let mut all = BTreeMap::new();
    for ifname in ["vethpa", "vethpb"] {
        for (attach, hook) in [
            (TcAttachType::Ingress, "tc_ingress"),
            (TcAttachType::Egress, "tc_egress"),
        ] {
            let found = attachments::tc(&lab.node, ifname, attach)
                .unwrap_or_else(|e| panic!("{ifname} {hook}: {e:#}"));
            all.insert(format!("{ifname} {hook}"), found);
        }
    }
    let xdp = attachments::xdp(&lab.node, "up0").unwrap_or_else(|e| panic!("up0 xdp: {e:#}"));
    all.insert("up0 xdp".to_owned(), xdp.into_iter().collect());
    all
}

/// Exactly one attachment per hook, and it is ipq's.
fn assert_one_ipq_per_hook(hooks: &BTreeMap<String, Vec<Attachment>>, when: &str) {
    for (hook, found) in hooks {
        assert!(
            found.len() == 1 && found[0].is_ipq(),
            "{when}: {hook} must have exactly one ipq attachment, has {found:?}"
        );
    }
}

/// Sets its flag when dropped: on the way out of a scope, normally or by a panic.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Traffic flows all along (pod a fenced both ways, v4 and v6; pod b as the control) while
/// the agent is SIGKILLed and started again. Not one of pod a's datagrams arrives, each is
/// counted as a fenced drop, pod b's all arrive, and the restarted agent took over the very
/// attachments of the first: one per hook, the same TCX link or the same filter.
#[test]
fn sigkill_under_traffic_delivers_no_fenced_packet_and_the_restart_readopts_each_hook() {
    let lab = Lab::new().expect("building the lab");
    let args = ["--workload", "vethp*", "--uplink", "up0"];
    let mut first = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    // Where the kernel has TCX, the filters that protected the pods at first have moved to
    // their TCX links: those are what the restart must take over.
    wait_tc_upgrades(&first);
    let attached = hooks(&lab);
    assert_one_ipq_per_hook(&attached, "first agent");
    let (in_before, eg_before) = first.fenced_drops();

    let stop = AtomicBool::new(false);
    let pause = scaled(Duration::from_millis(500));
    let (results, second) = std::thread::scope(|s| {
        // A panic below (an agent that cannot restart) must end the senders, or the scope
        // would wait for them forever and the kernel would only fail at QEMU's timeout.
        let _stop_on_unwind = StopOnDrop(&stop);
        let flows = [
            (
                "pod a -> peer v4",
                &lab.pod_a,
                &lab.peer,
                IpAddr::from(PEER_V4),
            ),
            ("pod a -> peer v6", &lab.pod_a, &lab.peer, PEER_V6.into()),
            ("peer -> pod a v4", &lab.peer, &lab.pod_a, POD_A_V4.into()),
            ("peer -> pod a v6", &lab.peer, &lab.pod_a, POD_A_V6.into()),
            ("pod b -> peer v4", &lab.pod_b, &lab.peer, PEER_V4.into()),
            ("peer -> pod b v6", &lab.peer, &lab.pod_b, POD_B_V6.into()),
        ];
        let senders: Vec<_> = flows
            .into_iter()
            .map(|(what, from, to, dst)| {
                let stop = &stop;
                (what, s.spawn(move || stream(from, to, dst, stop)))
            })
            .collect();
        std::thread::sleep(pause);
        first.kill9();
        // The gap: no agent runs, the attached programs alone enforce.
        std::thread::sleep(pause);
        let second = lab.start_agent(&args).expect("restarting ipq-agent");
        std::thread::sleep(pause);
        stop.store(true, Ordering::Relaxed);
        let results: Vec<_> = senders
            .into_iter()
            .map(|(what, h)| (what, h.join().expect("a traffic thread")))
            .collect();
        (results, second)
    });

    let (mut from_a, mut to_a) = (0, 0);
    for (what, (sent, received)) in &results {
        assert!(*sent > 0, "{what}: nothing sent");
        if what.contains("pod a") {
            assert_eq!(
                *received, 0,
                "{what}: {received} of {sent} fenced datagrams delivered"
            );
            if what.starts_with("pod a") {
                from_a += sent;
            } else {
                to_a += sent;
            }
        } else {
            assert_eq!(received, sent, "{what}: the control flow lost datagrams");
        }
    }
    let (in_after, eg_after) = second.fenced_drops();
    assert_eq!(
        (in_after - in_before, eg_after - eg_before),
        (from_a as f64, to_a as f64),
        "fenced drops across the restart (tc_ingress, tc_egress): every datagram counted"
    );

    let readopted = hooks(&lab);
    assert_one_ipq_per_hook(&readopted, "after the restart");
    assert_eq!(
        readopted, attached,
        "the restarted agent must take over the same attachments, not add or swap them"
    );
}

// ---------------------------------------------------------------------------------------------
// Reuse hygiene: the probe that decides how a claim's conntrack entries are flushed.

/// The agent's start-up log line for `family`'s claim flush.
fn probe_line(agent: &ipq_tests::lab::Agent, family: &str) -> String {
    let needle = format!("conntrack flush on claims, {family}:");
    ipq_tests::lab::poll(&needle, scaled(Duration::from_secs(5)), || {
        Ok(agent
            .log()
            .lines()
            .find(|l| l.contains(&needle))
            .map(str::to_owned))
    })
    .unwrap_or_else(|e| panic!("{e:#}; log:\n{}", agent.log()))
}

#[test]
fn the_conntrack_filter_probe_gives_this_kernels_answer_and_a_claim_is_flushed_its_way() {
    let lab = Lab::new().expect("lab");
    let agent = lab.start_agent(&[]).expect("starting ipq-agent");
    let version = ipq_tests::kernel::version();
    let (v4, v6) = (probe_line(&agent, "IPv4"), probe_line(&agent, "IPv6"));
    // Before 6.12 the kernel refuses CTA_FILTER on a flush; from 6.12 it honours it for IPv4
    // and inverts it for IPv6 (it deletes every entry *not* carrying the address).
    let (want_v4, want_v6) = if version < (6, 12) {
        ("refused a filtered flush", "refused a filtered flush")
    } else {
        ("honoured the filter", "did not honour the filter")
    };
    assert!(v4.contains(want_v4), "{version:?}: IPv4: {v4}");
    assert!(v6.contains(want_v6), "{version:?}: IPv6: {v6}");
    let kernel_v4 = v4.contains("the kernel's filtered flush");
    assert_eq!(kernel_v4, version >= (6, 12), "{v4}");
    assert!(v6.contains("a dump of the whole table"), "{v6}");

    // A claim (early reuse of pod A's addresses by B) is flushed the way the probe chose, and
    // without errors.
    let addrs: [IpAddr; 2] = [POD_A_V4.into(), POD_A_V6.into()];
    for addr in addrs {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("B's address");
    }
    let body = serde_json::json!({
        "addresses": addrs,
        "holder": {"interface": "vethpb", "mac": POD_B_LLADDR, "container_id": "c-new"},
        "source": "cni",
    });
    let answer = ipq_tests::api::request(
        &lab.work_dir().join("ipq.sock"),
        "POST",
        "/v1/claims",
        Some(&body.to_string()),
    )
    .expect("claim");
    assert_eq!(answer.status, 200, "{}", answer.body);
    let answer: serde_json::Value = answer.json().expect("json");
    let expected = [if kernel_v4 { "kernel" } else { "dump" }, "dump"];
    for (view, method) in answer["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .zip(expected)
    {
        let flush = &view["last_flush"];
        assert!(flush["errors"].is_null(), "{flush}; log:\n{}", agent.log());
        assert_eq!(flush["conntrack_flush"], method, "{flush}");
    }
}

/// Which bpf() watcher the agent runs on this kernel and CPU, and `ipq status` saying it
/// (#38·4). On arm64 the raw tracepoint is never the watcher (it reads x86-64's system call
/// registers): the trampolines where arm64 has BPF trampolines (6.0+; asserted from 6.12,
/// where every hooked function is in BTF), else the periodic verification alone, which the
/// status says. On x86-64 one of the two watchers always attaches.
#[test]
fn the_bpf_watcher_is_the_one_this_kernel_and_cpu_allow_and_status_says_which() {
    let lab = Lab::new().expect("lab");
    let mut agent = lab.start_agent(&[]).expect("starting ipq-agent");
    let mode = agent.bpf_watcher_mode().unwrap_or_else(|e| panic!("{e:#}"));
    let version = ipq_tests::kernel::version();
    let status = ipq_tests::api::ipq(&agent.api_socket(), &["status"]).expect("ipq status");
    let status = status.ok();
    let watcher_lines = || {
        agent
            .log()
            .lines()
            .filter(|l| l.contains("bpf() watcher"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if cfg!(target_arch = "aarch64") {
        assert_ne!(mode, "raw_tracepoint", "{}", watcher_lines());
        if version < (6, 0) {
            assert_eq!(mode, "none", "{version:?}: {}", watcher_lines());
        }
        if version >= (6, 12) {
            assert_eq!(mode, "trampolines", "{version:?}: {}", watcher_lines());
        }
    } else {
        assert_ne!(mode, "none", "{version:?}: {}", watcher_lines());
    }
    if mode == "none" {
        assert!(
            status.contains("periodic verification only")
                && status.contains("the bpf() watcher is not attached"),
            "ipq status must say the verification is alone:\n{status}"
        );
    } else {
        assert!(
            status.contains("bpf() watcher (") && !status.contains("periodic verification only"),
            "ipq status must name the watcher ({mode}):\n{status}"
        );
    }
    agent.terminate().expect("stopping the agent");
    drop(agent);

    // `bpf_watcher = trampolines`: the same trampolines where this kernel takes them, and
    // never the raw tracepoint on `sys_enter`, which every system call would pay for.
    let agent = lab
        .start_agent(&["--bpf-watcher", "trampolines"])
        .expect("starting ipq-agent");
    let only = agent.bpf_watcher_mode().unwrap_or_else(|e| panic!("{e:#}"));
    let expected = if mode == "trampolines" {
        "trampolines"
    } else {
        "none"
    };
    assert_eq!(only, expected, "bpf_watcher = trampolines (auto: {mode})");
    let kinds = agent.bpf_link_kinds().expect("the agent's links");
    assert!(
        !kinds.iter().any(|k| k == "raw_tracepoint"),
        "bpf_watcher = trampolines: a raw tracepoint link held ({kinds:?})"
    );
}
