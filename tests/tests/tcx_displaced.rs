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
};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_F_BEFORE: u32 = 1 << 3;

fn bpf(cmd: libc::c_long, attr: &[u8; 64]) -> std::io::Result<i32> {
    // SAFETY: `attr` outlives the call and the pointers in it point to live buffers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

/// A program that returns `TCX_PASS` (ends processing: ipq's behind it sees nothing).
fn foreign_program() -> i32 {
    let insns: [[u8; 8]; 2] = [[0xb7, 0, 0, 0, 0, 0, 0, 0], [0x95, 0, 0, 0, 0, 0, 0, 0]];
    let code: Vec<u8> = insns.iter().flatten().copied().collect();
    let license = b"GPL\0";
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..55].copy_from_slice(b"foreign");
    bpf(BPF_PROG_LOAD, &attr).expect("loading the foreign program")
}

/// A new link of `prog` at the head of `ifindex`'s TCX ingress: its descriptor.
fn attach_first(prog: i32, ifindex: u32) -> i32 {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(prog as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_TCX_INGRESS.to_ne_bytes());
    attr[12..16].copy_from_slice(&BPF_F_BEFORE.to_ne_bytes());
    bpf(BPF_LINK_CREATE, &attr).expect("attaching the foreign program first")
}

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
    lab.fence_pod_a().expect("fencing pod a");
    wait_tc_upgrades(&agent);
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    let vethpa_index = ifindex(&lab.node, "vethpa").expect("ifindex");
    // A hook takes a program once: each displacement is a program (and link) of its own.
    let mut progs = Vec::new();
    let mut displace = || {
        let prog = foreign_program();
        progs.push(prog);
        lab.node.run(|| attach_first(prog, vethpa_index))
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
        // SAFETY: descriptors attach_first returned, closed once.
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
        // SAFETY: descriptors foreign_program returned, closed once.
        unsafe { libc::close(prog) };
    }
}
