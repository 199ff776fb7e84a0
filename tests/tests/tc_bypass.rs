//! Nothing ahead of ipq in silence (netlink mode): another tool's filter added at a priority
//! before ipq's on a protected clsact hook (`tc filter add ... ingress pref 1 u32 match u32 0
//! 0 classid 1:1`, as a CNI's own filter does) ends classification, so the fenced pod's
//! packets never reach ipq's program. The kernel announces the filter; within milliseconds
//! the interface is `bypassed` by it: not protected in `ipq status`, `/readyz` failing, the
//! bypassed gauge and counter set. ipq never touches the filter; once it is deleted, the
//! interface is protected again and the pod fenced.
//!
//! Needs root, bpffs, `tc` (iproute2) and `target/debug/ipq-agent`; `cargo xtask test`
//! provides them.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use ipq_tests::{
    api,
    lab::{poll, udp_burst, Agent, Lab, PEER_V4},
    netns::{output_of, NetNs},
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
