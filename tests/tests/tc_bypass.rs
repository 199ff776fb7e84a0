//! Nothing ahead of ipq in silence (netlink mode): another tool's filter added at a priority
//! before ipq's on a protected clsact hook (`tc filter add ... ingress pref 1 u32 match u32 0
//! 0 classid 1:1`, as a CNI's own filter does) ends classification, so the fenced pod's
//! packets never reach ipq's program. The kernel announces the filter; within milliseconds
//! the interface is `bypassed` by it: not protected in `ipq status`, `/readyz` failing, the
//! bypassed gauge and counter set. ipq never touches the filter; once it is deleted, the
//! interface is protected again and the pod fenced.
//!
//! A co-tenant's cls_bpf direct-action filter ahead of ipq's is run on a packet of each of the
//! interface's addresses: one that hands packets on (`TC_ACT_UNSPEC`) leaves the interface
//! protected and the agent ready, and the fenced pod's packets are still dropped; one that ends
//! classification (`TC_ACT_OK`) makes it `bypassed`, as above. An agent with the DaemonSet's
//! capabilities (no `CAP_SYS_ADMIN`) cannot run another tool's program: the interface is
//! `unverified`, not ready, and the status says why.
//!
//! Needs root, bpffs, `tc` (iproute2), `setpriv` (util-linux) and `target/debug/ipq-agent`;
//! `cargo xtask test` provides them.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use ipq_tests::{
    api,
    lab::{poll, udp_burst, Agent, Lab, PEER_V4, POD_A_V4},
    netns::{output_of, BpffsDir, NetNs},
    raw_bpf::{obj_pin, program_returning},
};

fn tc(ns: &NetNs, args: &str) {
    output_of(ns.command("tc").args(args.split_whitespace()))
        .unwrap_or_else(|e| panic!("tc {args}: {e:#}"));
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

fn metric(agent: &Agent, name: &str) -> f64 {
    agent.metric(name, &[("hook", "tc_ingress")]).unwrap_or(0.0)
}

#[test]
fn a_filter_ahead_of_ipqs_makes_the_interface_bypassed_at_once_and_protected_once_it_goes() {
    let lab = Lab::new().expect("building the lab");
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "netlink",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    assert_eq!(vethpa(&agent)["protection"], "protected");

    let added = Instant::now();
    tc(
        &lab.node,
        "filter add dev vethpa ingress pref 1 u32 match u32 0 0 classid 1:1",
    );
    poll("vethpa bypassed", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let took = added.elapsed();
    eprintln!("bypassed reported {took:?} after the filter was added");
    assert!(
        took < Duration::from_millis(500),
        "reported {took:?} after the filter"
    );
    let interface = vethpa(&agent);
    let error = interface["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("tc-ingress: u32 filter pref 1"),
        "the filter is named: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("bypassed"), "{body}");
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 1.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 1.0);
    assert!(metric(&agent, "ipq_datapath_unprotected_interfaces") >= 1.0);
    // What ipq says is what the kernel does: the pod's packets get past ipq now.
    assert!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10) > 0,
        "the filter ahead ends classification before ipq's program"
    );
    let still = output_of(
        lab.node
            .command("tc")
            .args(["filter", "show", "dev", "vethpa", "ingress", "pref", "1"]),
    )
    .expect("tc filter show");
    assert!(
        still.contains("u32"),
        "ipq never touches the filter: {still}"
    );
    assert!(
        agent.log().contains("NOT PROTECTED: bypassed"),
        "{}",
        agent.log()
    );

    tc(&lab.node, "filter del dev vethpa ingress pref 1");
    poll("vethpa protected again", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 0.0);
}

/// `TC_ACT_UNSPEC`: a direct-action filter returning it hands the packet to the next filter.
const TC_ACT_UNSPEC: i32 = -1;
/// `TC_ACT_OK`: ends classification, the packet goes on unseen by later filters.
const TC_ACT_OK: i32 = 0;

/// A program returning `code`, pinned in `dir` as `name` (for `tc ... object-pinned`).
fn pinned_program(dir: &BpffsDir, code: i32, name: &str) -> std::path::PathBuf {
    let prog = program_returning(code, name);
    let path = dir.path().join(name);
    obj_pin(prog, &path);
    // SAFETY: the descriptor program_returning returned; the pin keeps the program.
    unsafe { libc::close(prog) };
    path
}

fn cotenants(agent: &Agent, verdict: &str) -> f64 {
    agent
        .metric(
            "ipq_datapath_cotenants_ahead",
            &[("hook", "tc_ingress"), ("verdict", verdict)],
        )
        .unwrap_or(-1.0)
}

#[test]
fn a_bpf_filter_ahead_that_hands_packets_on_keeps_the_interface_protected_and_one_that_passes_them_does_not(
) {
    let lab = Lab::new().expect("building the lab");
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "netlink",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    let pins = BpffsDir::new().expect("a bpffs dir of the test's own");

    // Hands on: TC_ACT_UNSPEC for every packet.
    let hands_on = pinned_program(&pins, TC_ACT_UNSPEC, "cotenant_next");
    tc(
        &lab.node,
        &format!(
            "filter add dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            hands_on.display()
        ),
    );
    let interface = poll("the filter ahead judged", Duration::from_secs(5), || {
        let interface = vethpa(&agent);
        Ok(interface["ahead"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            .then_some(interface))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(interface["protection"], "protected", "{interface}");
    let ahead = interface["ahead"][0].as_str().unwrap_or_default();
    assert!(
        ahead.contains("bpf filter pref 1")
            && ahead.contains("cotenant_next")
            && ahead.contains("hands packets on")
            && ahead.contains("TC_ACT_UNSPEC"),
        "the status names the filter and what it does: {interface}"
    );
    assert!(
        ahead.contains(&POD_A_V4.to_string()),
        "it was run on a packet of the fenced pod's address: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(
        code, 200,
        "a co-tenant that hands packets on keeps the node ready: {body}"
    );
    // The witness: the fenced pod's datagrams still meet ipq's program, which drops them.
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 200),
        0,
        "every fenced datagram is handed on to ipq's filter and dropped"
    );
    assert_eq!(cotenants(&agent, "hands_on"), 1.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 0.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 0.0);
    let run = api::ipq(&agent.api_socket(), &["status"]).expect("ipq status");
    let status = run.ok();
    assert!(
        status.contains("co-tenant ahead hands on") && status.contains("ahead of ipq on vethpa"),
        "ipq status says why vethpa is protected:\n{status}"
    );

    // Ends classification: TC_ACT_OK for every packet (the filter's program replaced in place).
    let passes = pinned_program(&pins, TC_ACT_OK, "cotenant_ok");
    tc(
        &lab.node,
        &format!(
            "filter replace dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            passes.display()
        ),
    );
    poll("vethpa bypassed", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    let error = interface["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cotenant_ok") && error.contains("TC_ACT_OK"),
        "the filter and its verdict are named: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 1.0);
    assert_eq!(cotenants(&agent, "ends_processing"), 1.0);
    assert_eq!(cotenants(&agent, "hands_on"), 0.0);
    let delivered = udp_burst(&lab.pod_a, &lab.peer, peer, 200);
    eprintln!("{delivered} of 200 fenced datagrams delivered past the TC_ACT_OK filter");
    assert!(delivered > 0, "what ipq reports is what the kernel does");

    // Back to handing packets on, in place: protected and ready again, fenced again.
    tc(
        &lab.node,
        &format!(
            "filter replace dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            hands_on.display()
        ),
    );
    poll("vethpa protected again", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    assert!(
        interface["ahead"][0]
            .as_str()
            .is_some_and(|a| a.contains("cotenant_next") && a.contains("hands packets on")),
        "{interface}"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    assert_eq!(cotenants(&agent, "ends_processing"), 0.0);
    assert_eq!(cotenants(&agent, "hands_on"), 1.0);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 200),
        0,
        "fenced again behind the filter that hands packets on"
    );

    tc(&lab.node, "filter del dev vethpa ingress pref 1");
    poll("nothing ahead any more", Duration::from_secs(5), || {
        Ok(vethpa(&agent)["ahead"]
            .as_array()
            .is_none_or(|a| a.is_empty())
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(vethpa(&agent)["protection"], "protected");
    assert_eq!(cotenants(&agent, "hands_on"), 0.0);
}

#[test]
fn an_agent_with_the_daemonsets_capabilities_says_it_cannot_tell_what_a_bpf_filter_ahead_does() {
    let lab = Lab::new().expect("building the lab");
    // What deploy/kubernetes/30-daemonset.yaml grants: no CAP_SYS_ADMIN, so no
    // BPF_PROG_GET_FD_BY_ID of another tool's program.
    let daemonset = [
        "setpriv",
        "--inh-caps",
        "-all",
        "--bounding-set",
        "-all,+bpf,+net_admin,+net_raw,+perfmon",
        "--",
    ];
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "netlink",
    ];
    let agent = lab
        .start_agent_wrapped(&daemonset, &args)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    lab.maps().fence_pod_a().expect("fencing pod a");
    let pins = BpffsDir::new().expect("a bpffs dir of the test's own");
    let hands_on = pinned_program(&pins, TC_ACT_UNSPEC, "cotenant_next");
    tc(
        &lab.node,
        &format!(
            "filter add dev vethpa ingress pref 1 bpf da object-pinned {}",
            hands_on.display()
        ),
    );
    poll("vethpa unverified", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "unverified").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    let error = interface["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("CAP_SYS_ADMIN") && error.contains("cotenant_next"),
        "the status says what it cannot tell and why: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "cannot tell is not ready: {body}");
    assert!(body.contains("unverified"), "{body}");
    assert_eq!(cotenants(&agent, "cannot_tell"), 1.0);
    assert_eq!(
        metric(&agent, "ipq_datapath_bypasses_total"),
        0.0,
        "not counted as a bypass: nothing was seen to end processing"
    );
    tc(&lab.node, "filter del dev vethpa ingress pref 1");
    poll("vethpa protected again", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(agent.readyz().expect("readyz").0, 200);
}
