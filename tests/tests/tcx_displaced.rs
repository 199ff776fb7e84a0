//! A tool that keeps putting its program at the head of a TCX hook, ahead of ipq's link (each
//! time a new link with `BPF_F_BEFORE`): ipq moves its link first again (detaching the old
//! one explicitly, so the new link never meets EEXIST), a few times a minute at most; past
//! that the hook is `bypassed`, not fought in silence: unprotected in `ipq status`, `/readyz`
//! 503, counted. Once the tool stops, ipq is first again and the interface protected.
//!
//! Needs root, bpffs and `target/debug/ipq-agent` on a kernel with TCX (this host).

use std::{net::IpAddr, time::Duration};

use aya::programs::{SchedClassifier, TcAttachType};
use ipq_tests::{
    api,
    attach::wait_tc_upgrades,
    lab::{ifindex, poll, udp_burst, Agent, Lab, PEER_V4},
    raw_bpf::foreign_program_first,
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
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "tcx",
        "--verify-interval",
        "100ms",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    wait_tc_upgrades(&agent);
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    let vethpa_index = ifindex(&lab.node, "vethpa").expect("ifindex");
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
