//! A tool that keeps putting its program at the head of a TCX hook, ahead of ipq's link (each
//! time a new link with `BPF_F_BEFORE`): ipq moves its link first again (detaching the old
//! one explicitly, so the new link never meets EEXIST), a few times a minute at most; past
//! that the hook is `bypassed`, not fought in silence: unprotected in `ipq status`, `/readyz`
//! 503, counted. Once the tool stops, ipq is first again and the interface protected.
//!
//! A tool whose program at the head hands every packet on (`TCX_NEXT`) is no bypass: ipq's
//! program still sees every packet, so its link is left behind it (reordering another tool's
//! programs changes what they see), the interface stays protected and the agent ready.
//!
//! Where ipq must move (a program ahead that ends processing for ipq's probe, or one it cannot
//! tell), the move is make-before-break: a link of the spare instance of ipq's program goes in
//! at the head before the old link is detached, so a co-tenant that hands the fenced pod's
//! packets on (and ends processing only for the probe's port) leaks none of them while ipq
//! moves (a continuous stream counted by a witness).
//!
//! What a program ahead does is told by ipq's probes (docs/datapath.md), with the DaemonSet's
//! capabilities (no `CAP_SYS_ADMIN`).
//!
//! A tool whose program ends processing and re-attaches at the head every 500 ms for 30 s:
//! what it passes between its re-attach and ipq's move (and after ipq stops fighting it, past
//! the rate limit) is delivered, and that is counted and reported (`bypassed`, `/readyz` 503).
//!
//! Needs root, bpffs, `setpriv` and `target/debug/ipq-agent` on a kernel with TCX (this host).

use std::{
    net::{IpAddr, Ipv4Addr, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use ipq_common::probe::PROBE_PORT;
use ipq_tests::{
    api,
    attach::wait_tc_upgrades,
    lab::{ifindex, poll, udp_burst, Agent, Lab, DAEMONSET_CAPS, PEER_V4},
    raw_bpf::{attach_first, foreign_program_first, program_passing_port, program_returning},
};

/// Whether ipq's program runs first on vethpa's TCX ingress (the kernel lists the chain in
/// the order it runs).
fn ipq_first(lab: &Lab) -> bool {
    let (_, programs) = lab
        .node
        .run(|| SchedClassifier::query_tcx("vethpa", TcAttachType::Ingress))
        .expect("query_tcx vethpa ingress");
    programs
        .first()
        .and_then(|p| p.name_as_str())
        .is_some_and(|name| name.starts_with("ipq_tc"))
}

/// The agent's arguments in every test here: TCX, and a verification every 100 ms.
const TCX_AGENT: [&str; 8] = [
    "--workload",
    "vethp*",
    "--uplink",
    "up0",
    "--tc-attach",
    "tcx",
    "--verify-interval",
    "100ms",
];

/// Fences pod a, waits until the agent holds its hooks by TCX links, and returns vethpa's
/// ifindex.
fn fence_pod_a_under_tcx(lab: &Lab, agent: &Agent) -> u32 {
    lab.maps().fence_pod_a().expect("fencing pod a");
    wait_tc_upgrades(agent);
    ifindex(&lab.node, "vethpa").expect("ifindex")
}

fn vethpa(agent: &Agent) -> serde_json::Value {
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("GET /v1/status")
        .json()
        .expect("status JSON");
    status["interfaces"]
        .as_array()
        .and_then(|all| all.iter().find(|i| i["name"] == "vethpa").cloned())
        .unwrap_or_else(|| panic!("vethpa not in {status}"))
}

#[test]
fn a_tool_that_keeps_displacing_ipqs_link_is_rate_limited_reported_and_then_let_go() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&TCX_AGENT).expect("starting ipq-agent");
    let vethpa_index = fence_pod_a_under_tcx(&lab, &agent);
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    // A hook takes a program once: each displacement is a program (and link) of its own.
    let mut progs = Vec::new();
    let mut displace = || {
        let (prog, link) = lab.node.run(|| foreign_program_first(vethpa_index));
        progs.push(prog);
        link
    };

    // Three displacements: each is undone (ipq first again), none with EEXIST.
    let mut links = Vec::new();
    for round in 1..=3 {
        links.push(displace());
        poll(
            &format!("ipq first again after displacement {round}"),
            Duration::from_secs(10),
            || Ok(ipq_first(&lab).then_some(())),
        )
        .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    }
    assert!(!agent.log().contains("File exists"), "{}", agent.log());

    // The fourth within the minute: not fought, reported.
    links.push(displace());
    poll("vethpa bypassed", Duration::from_secs(10), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    assert!(
        interface["error"]
            .as_str()
            .is_some_and(|e| e.contains("rate-limited")),
        "{interface}"
    );
    assert!(!ipq_first(&lab), "ipq's link left behind the tool's");
    assert_eq!(agent.readyz().expect("readyz").0, 503);
    let bypasses = agent
        .metric("ipq_datapath_bypasses_total", &[("hook", "tc_ingress")])
        .expect("bypasses");
    assert_eq!(bypasses, 4.0, "three moves and one refusal");
    assert_eq!(
        agent
            .metric(
                "ipq_datapath_bypassed_interfaces",
                &[("hook", "tc_ingress")]
            )
            .expect("gauge"),
        1.0
    );

    // The tool stops: its links go, ipq's is first, the interface protected.
    for link in links {
        // SAFETY: link descriptors foreign_program_first returned, closed once.
        unsafe { libc::close(link) };
    }
    poll("vethpa protected again", Duration::from_secs(10), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert!(ipq_first(&lab));
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    for prog in progs {
        // SAFETY: program descriptors foreign_program_first returned, closed once.
        unsafe { libc::close(prog) };
    }
}

/// `TCX_NEXT`: a TCX program returning it hands the packet to the next program.
const TCX_NEXT: i32 = -1;

fn verify_passes(agent: &Agent) -> f64 {
    agent
        .metric("ipq_datapath_verify_passes_total", &[("cause", "periodic")])
        .expect("verify passes")
}

#[test]
fn a_program_at_the_head_that_hands_packets_on_is_left_where_it_is() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(&DAEMONSET_CAPS, &TCX_AGENT)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    let vethpa_index = fence_pod_a_under_tcx(&lab, &agent);
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");

    let prog = program_returning(TCX_NEXT, "cotenant_next");
    let link = lab
        .node
        .run(|| attach_first(prog, vethpa_index))
        .expect("attaching the co-tenant at the head");
    assert!(!ipq_first(&lab), "the co-tenant runs first");
    let interface = poll("the program ahead judged", Duration::from_secs(10), || {
        let interface = vethpa(&agent);
        Ok(interface["ahead"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            .then_some(interface))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let ahead = interface["ahead"][0].as_str().unwrap_or_default();
    assert!(
        ahead.contains("hands packets on")
            && ahead.contains("reached ipq's program")
            && ahead.contains("TCX program id"),
        "{interface}"
    );
    assert_eq!(interface["protection"], "protected", "{interface}");
    // Three more passes, each of which would have moved ipq's link: it stays behind.
    let passes = verify_passes(&agent);
    agent
        .wait_metric(
            "ipq_datapath_verify_passes_total",
            &[("cause", "periodic")],
            Duration::from_secs(10),
            "three more passes",
            |v| v >= passes + 3.0,
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        !ipq_first(&lab),
        "ipq does not reorder a co-tenant that hands packets on\n{}",
        agent.log()
    );
    assert_eq!(vethpa(&agent)["protection"], "protected");
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 200),
        0,
        "every fenced packet is handed on to ipq's program and dropped"
    );
    let bypasses = agent
        .metric("ipq_datapath_bypasses_total", &[("hook", "tc_ingress")])
        .expect("bypasses");
    assert_eq!(bypasses, 0.0, "no move, no bypass\n{}", agent.log());
    assert_eq!(
        agent
            .metric(
                "ipq_datapath_cotenants_ahead",
                &[("hook", "tc_ingress"), ("verdict", "hands_on")]
            )
            .expect("gauge"),
        1.0
    );

    // SAFETY: the descriptors above, closed once: the co-tenant goes.
    unsafe {
        libc::close(link);
        libc::close(prog);
    }
    poll("nothing ahead any more", Duration::from_secs(10), || {
        let interface = vethpa(&agent);
        Ok(interface["ahead"]
            .as_array()
            .is_none_or(|a| a.is_empty())
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert!(ipq_first(&lab));
}

/// `prog` attached at the head of vethpa's TCX ingress again, its previous link just closed.
/// The hook takes a program once, and the old link outlives its close while a process that
/// another test of this binary is spawning holds a copy of this process's descriptors (until
/// its exec closes them): EEXIST then, retried for up to a second.
fn reattach_first(lab: &Lab, prog: i32, ifindex: u32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match lab.node.run(|| attach_first(prog, ifindex)) {
            Ok(link) => return link,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("re-attaching the co-tenant at the head: {e}"),
        }
    }
}

/// Sets its flag when dropped: a panic in a test's body stops the stream too, instead of
/// leaving `thread::scope` waiting for it forever (a hung test, not a failed one).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Fenced datagrams from pod a to the peer until `stop`, and how many of them the peer
/// received: (sent, delivered). Without `pace`, as fast as one thread sends them (a yield
/// every 16): a gap of ipq's program of a few microseconds meets some; with it, one per
/// `pace`.
fn fenced_stream(lab: &Lab, stop: &AtomicBool, pace: Option<Duration>) -> (usize, usize) {
    let peer = IpAddr::from(PEER_V4);
    let rx = lab
        .peer
        .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .expect("binding the witness");
    let port = rx.local_addr().expect("bound").port();
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("a timeout");
    let tx = lab
        .pod_a
        .run(|| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)))
        .expect("binding the sender");
    let tag = b"ipq-move-witness";
    let delivered = std::thread::scope(|scope| {
        let counter = scope.spawn(|| {
            let mut delivered = 0;
            let mut buf = [0u8; 64];
            loop {
                match rx.recv_from(&mut buf) {
                    Ok((len, _)) if buf[..len] == tag[..] => delivered += 1,
                    Ok(_) => {}
                    Err(_) if stop.load(Ordering::Relaxed) => break delivered,
                    Err(_) => {}
                }
            }
        });
        let mut sent = 0;
        while !stop.load(Ordering::Relaxed) {
            tx.send_to(tag, (peer, port)).expect("sending");
            sent += 1;
            match pace {
                Some(pace) => std::thread::sleep(pace),
                None if sent % 16 == 0 => std::thread::yield_now(),
                None => {}
            }
        }
        (sent, counter.join().expect("the witness"))
    });
    delivered
}

#[test]
fn ipqs_own_moves_ahead_of_a_program_that_ends_processing_for_its_probe_leak_no_fenced_packet() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(&DAEMONSET_CAPS, &TCX_AGENT)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    let vethpa_index = fence_pod_a_under_tcx(&lab, &agent);
    // It hands every packet on but ipq's probe (its port): the probe says it ends processing,
    // so ipq moves ahead of it, and whatever of the stream leaks, leaks through a gap of ipq's
    // own.
    let prog = program_passing_port(PROBE_PORT, "cotenant_port");

    let stop = AtomicBool::new(false);
    let ((sent, delivered), moves) = std::thread::scope(|scope| {
        let stream = scope.spawn(|| fenced_stream(&lab, &stop, None));
        let stopper = StopOnDrop(&stop);
        let mut moves = 0;
        let mut link = None;
        // Three re-attaches at the head (the rate limit lets three moves a minute).
        for round in 1..=3 {
            if let Some(old) = link.take() {
                // SAFETY: the co-tenant's link descriptor, closed once: it leaves the hook.
                unsafe { libc::close(old) };
            }
            link = Some(reattach_first(&lab, prog, vethpa_index));
            let at = Instant::now();
            poll(
                &format!("ipq first again after re-attach {round}"),
                Duration::from_secs(10),
                || Ok(ipq_first(&lab).then_some(())),
            )
            .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
            eprintln!("re-attach {round}: ipq first again in {:?}", at.elapsed());
            moves += 1;
            std::thread::sleep(Duration::from_millis(500).saturating_sub(at.elapsed()));
        }
        // The stream goes on past the last move, then stops.
        std::thread::sleep(Duration::from_millis(200));
        drop(stopper);
        if let Some(old) = link.take() {
            // SAFETY: as above.
            unsafe { libc::close(old) };
        }
        (stream.join().expect("the stream"), moves)
    });
    // SAFETY: the co-tenant's program descriptor, closed once.
    unsafe { libc::close(prog) };
    eprintln!("{moves} moves of ipq's link: {delivered} of {sent} fenced datagrams delivered");
    assert!(sent > 10_000, "a stream, not a trickle: {sent}");
    assert_eq!(
        delivered,
        0,
        "ipq's own moves leaked {delivered} of {sent} fenced datagrams\n{}",
        agent.log()
    );
    assert!(
        agent.log().contains("moved without a gap"),
        "{}",
        agent.log()
    );
}

/// `TCX_PASS`: a TCX program returning it ends processing; the packet goes on unseen by ipq.
const TCX_PASS: i32 = 0;

#[test]
fn a_program_that_ends_processing_and_keeps_re_attaching_at_the_head_is_counted_and_reported() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(&DAEMONSET_CAPS, &TCX_AGENT)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    let vethpa_index = fence_pod_a_under_tcx(&lab, &agent);
    let prog = program_returning(TCX_PASS, "cotenant_pass");

    let stop = AtomicBool::new(false);
    let (sent, delivered) = std::thread::scope(|scope| {
        // Paced: 30 s of a flood would only load the machine; the leak is the co-tenant's.
        let stream = scope.spawn(|| fenced_stream(&lab, &stop, Some(Duration::from_micros(200))));
        let stopper = StopOnDrop(&stop);
        let started = Instant::now();
        let mut link: Option<i32> = None;
        let mut reported_bypassed = false;
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(old) = link.take() {
                // SAFETY: the co-tenant's link descriptor, closed once: it leaves the hook.
                unsafe { libc::close(old) };
            }
            link = Some(reattach_first(&lab, prog, vethpa_index));
            std::thread::sleep(Duration::from_millis(500));
            reported_bypassed |= vethpa(&agent)["protection"] == "bypassed";
        }
        assert!(reported_bypassed, "the fight is reported\n{}", agent.log());
        let interface = vethpa(&agent);
        assert_eq!(interface["protection"], "bypassed", "{interface}");
        assert!(
            interface["error"]
                .as_str()
                .is_some_and(|e| e.contains("rate-limited")),
            "{interface}"
        );
        assert_eq!(agent.readyz().expect("readyz").0, 503);
        drop(stopper);
        if let Some(old) = link.take() {
            // SAFETY: as above.
            unsafe { libc::close(old) };
        }
        stream.join().expect("the stream")
    });
    // SAFETY: the co-tenant's program descriptor, closed once.
    unsafe { libc::close(prog) };
    let bypasses = agent
        .metric("ipq_datapath_bypasses_total", &[("hook", "tc_ingress")])
        .expect("bypasses");
    eprintln!(
        "a co-tenant ending processing, re-attached at the head every 500 ms for 30 s: \
         {delivered} of {sent} fenced datagrams delivered through it; {bypasses} bypasses \
         counted"
    );
    assert!(delivered > 0, "what ipq reports is what the kernel does");
    assert!(
        bypasses >= 4.0,
        "three moves and at least one refusal: {bypasses}"
    );
    poll("vethpa protected again", Duration::from_secs(10), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
}
