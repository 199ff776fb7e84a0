//! TC programs attached as a clsact cls_bpf filter over netlink (`tc_attach = "netlink"`, what
//! kernels without TCX get; this host has TCX, so the key forces the path): enforcement with
//! real traffic, a SIGKILL restart that replaces ipq's filter in place with no gap and no
//! second filter, switches between netlink and TCX that leave nothing of the other mode, and
//! other tools' filters on the same clsact left exactly as they were.
//!
//! Needs root, bpffs, `tc` (iproute2) and `target/debug/ipq-agent`; `cargo xtask test`
//! provides all of them.

use std::{net::IpAddr, thread, time::Duration};

use ipq::datapath::attach::tc_filter::{Direction, Filter};
use ipq_api::AttachedHook;
use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};
use ipq_tests::{
    api,
    attach::{filters, ipq_tc_attachments, link_pins},
    flows::Flows,
    lab::{poll, udp_burst, Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_V4, POD_B_V6},
    netns::{output_of, NetNs},
};

const N: usize = 10;
const PODS: [&str; 2] = ["vethpa", "vethpb"];
const DIRS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

fn args(mode: &'static str) -> Vec<&'static str> {
    vec![
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        mode,
    ]
}

/// Pod a (fenced) gets nothing through either way, v4 and v6; pod b gets everything.
fn check_fenced(lab: &Lab, when: &str) {
    let families: [(IpAddr, IpAddr, IpAddr); 2] = [
        (POD_A_V4.into(), POD_B_V4.into(), PEER_V4.into()),
        (POD_A_V6.into(), POD_B_V6.into(), PEER_V6.into()),
    ];
    for (a, b, peer) in families {
        let got = udp_burst(&lab.pod_a, &lab.peer, peer, N);
        assert_eq!(got, 0, "{when}: pod a -> {peer} delivered {got} of {N}");
        let got = udp_burst(&lab.peer, &lab.pod_a, a, N);
        assert_eq!(got, 0, "{when}: peer -> {a} delivered {got} of {N}");
        let got = udp_burst(&lab.pod_b, &lab.peer, peer, N);
        assert_eq!(got, N, "{when}: pod b -> {peer} delivered {got} of {N}");
        let got = udp_burst(&lab.peer, &lab.pod_b, b, N);
        assert_eq!(got, N, "{when}: peer -> {b} delivered {got} of {N}");
    }
}

/// Every TC hook of both pods carries exactly one ipq attachment, made the way `mode` says,
/// and nothing of the other mode.
fn assert_attached_as(lab: &Lab, mode: &str, when: &str) {
    let want = if mode == "netlink" { (1, 0) } else { (0, 1) };
    for ifname in PODS {
        for dir in DIRS {
            assert_eq!(
                ipq_tc_attachments(&lab.node, ifname, dir),
                want,
                "{when}: {ifname} {dir:?} (ipq netlink filters, ipq TCX programs)"
            );
        }
    }
    let pins = link_pins(lab.bpffs.path());
    let tc_pins: Vec<&String> = pins.iter().filter(|p| p.contains("tcx")).collect();
    let want_pins = if mode == "netlink" { 0 } else { 4 };
    assert_eq!(tc_pins.len(), want_pins, "{when}: TC link pins {pins:?}");
    assert_eq!(
        pins.iter().filter(|p| p.ends_with("-xdp")).count(),
        1,
        "{when}: XDP pins {pins:?}"
    );
}

/// `ipq status` names each pod's hooks by the attachment they have: `tc-ingress`/`tc-egress`
/// under ipq's netlink filter, `tcx-ingress`/`tcx-egress` under a TCX link.
fn assert_hook_names(agent: &ipq_tests::lab::Agent, mode: &str, when: &str) {
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("GET /v1/status")
        .json()
        .expect("status JSON");
    let want = if mode == "netlink" {
        [AttachedHook::TcIngress, AttachedHook::TcEgress]
    } else {
        [AttachedHook::TcxIngress, AttachedHook::TcxEgress]
    };
    for ifname in PODS {
        let interface = status["interfaces"]
            .as_array()
            .and_then(|all| all.iter().find(|i| i["name"] == ifname))
            .unwrap_or_else(|| panic!("{when}: {ifname} not in {status}"));
        let mut hooks: Vec<AttachedHook> = serde_json::from_value(interface["hooks"].clone())
            .unwrap_or_else(|e| panic!("{when}: {ifname}'s hooks in {interface}: {e}"));
        hooks.sort_unstable();
        let mut wanted = want.to_vec();
        wanted.sort_unstable();
        assert_eq!(hooks, wanted, "{when}: {ifname}'s hooks in {interface}");
    }
    let log = agent.log();
    if mode == "netlink" {
        assert!(
            !log.contains("tcx-"),
            "{when}: the log names a TCX hook in netlink mode:\n{log}"
        );
    }
}

/// `tc <args> [bytecode]`: the classic-BPF bytecode is one argument with spaces inside.
fn tc(ns: &NetNs, args: &str, bytecode: Option<&str>) {
    let mut cmd = ns.command("tc");
    cmd.args(args.split_whitespace());
    if let Some(code) = bytecode {
        cmd.args(["bytecode", code]);
    }
    output_of(&mut cmd).unwrap_or_else(|e| panic!("tc {args}: {e:#}"));
}

/// Classic BPF `ret #0`: no match, classification goes on.
const NO_MATCH: &str = "1,6 0 0 0,";

/// Another tool's filters on vethpa, after ipq's on both hooks, each running a classic-BPF
/// program that returns 0 (no match: classification goes on to the next filter). (A filter
/// *before* ipq's makes the interface `bypassed`, whatever its program returns: ipq cannot
/// tell what it will classify; `tc_bypass.rs` covers it.)
fn add_foreign_filters(lab: &Lab) -> Vec<Filter> {
    tc(&lab.node, "qdisc add dev vethpa clsact", None);
    tc(
        &lab.node,
        "filter add dev vethpa ingress pref 3 handle 1 bpf",
        Some(NO_MATCH),
    );
    tc(
        &lab.node,
        "filter add dev vethpa egress pref 49152 handle 7 bpf",
        Some(NO_MATCH),
    );
    foreign_filters(lab)
}

fn foreign_filters(lab: &Lab) -> Vec<Filter> {
    DIRS.iter()
        .flat_map(|dir| filters(&lab.node, "vethpa", *dir))
        .filter(|f| !f.is_ipq())
        .collect()
}

#[test]
fn netlink_filters_enforce_and_a_sigkill_restart_replaces_them_in_place() {
    let lab = Lab::new().expect("building the lab");
    let mut first = lab
        .start_agent(&args("netlink"))
        .expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    check_fenced(&lab, "netlink mode");
    assert_attached_as(&lab, "netlink", "first agent");
    for ifname in PODS {
        for dir in DIRS {
            let ours: Vec<Filter> = filters(&lab.node, ifname, dir)
                .into_iter()
                .filter(Filter::is_ipq)
                .collect();
            assert_eq!(
                (ours[0].priority, ours[0].handle),
                (TC_FILTER_PRIORITY, TC_FILTER_HANDLE),
                "{ifname} {dir:?}"
            );
        }
    }
    let status = api::request(&first.api_socket(), "GET", "/v1/status", None)
        .expect("GET /v1/status")
        .json()
        .expect("status JSON");
    assert_eq!(status["tc_attach"], "netlink", "{status}");
    assert_eq!(status["unprotected"], 0, "{status}");
    assert_hook_names(&first, "netlink", "netlink mode");

    // SIGKILL and a new agent while the fenced pod sends all along, v4 and v6: not one of its
    // datagrams may reach the peer, while pod b's flow (sent the same way) proves traffic ran.
    let flows = Flows::start(&lab);
    thread::sleep(Duration::from_millis(200));
    first.kill9();
    thread::sleep(Duration::from_millis(300));
    let second = lab
        .start_agent(&args("netlink"))
        .expect("restarting ipq-agent");
    thread::sleep(Duration::from_millis(300));
    flows.stop_and_check(100, "across the restart");

    // Replaced in place: still exactly one ipq filter per hook, nothing else appeared.
    assert_attached_as(&lab, "netlink", "after SIGKILL and restart");
    check_fenced(&lab, "after the restart");
    drop(second);
}

#[test]
fn switching_between_netlink_and_tcx_leaves_no_leftovers_and_no_foreign_filter_touched() {
    let lab = Lab::new().expect("building the lab");
    let foreign = add_foreign_filters(&lab);
    assert_eq!(foreign.len(), 2, "foreign filters: {foreign:?}");

    let mut agent = lab
        .start_agent(&args("netlink"))
        .expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    check_fenced(&lab, "netlink mode");
    assert_attached_as(&lab, "netlink", "netlink mode");
    assert_eq!(foreign_filters(&lab), foreign, "netlink mode");
    agent.terminate().expect("stopping the netlink-mode agent");

    // netlink -> TCX (as after a kernel upgrade under tc_attach = "auto").
    let mut agent = lab.start_agent(&args("tcx")).expect("starting in TCX mode");
    check_fenced(&lab, "TCX mode after netlink mode");
    assert_attached_as(&lab, "tcx", "TCX mode after netlink mode");
    assert_hook_names(&agent, "tcx", "TCX mode after netlink mode");
    assert_eq!(foreign_filters(&lab), foreign, "TCX mode");
    agent.kill9();

    // TCX -> netlink, after a SIGKILL.
    let agent = lab
        .start_agent(&args("netlink"))
        .expect("starting in netlink mode again");
    check_fenced(&lab, "netlink mode after TCX mode");
    assert_attached_as(&lab, "netlink", "netlink mode after TCX mode");
    assert_eq!(foreign_filters(&lab), foreign, "netlink mode again");

    // Renamed out of the workload globs: ipq's filters leave the interface, nobody else's do.
    for step in [
        "link set vethpa down",
        "link set vethpa name qpa",
        "link set qpa up",
    ] {
        lab.node
            .ip(&step.split_whitespace().collect::<Vec<_>>())
            .expect(step);
    }
    poll(
        "ipq's filters removed from qpa",
        Duration::from_secs(10),
        || {
            let left: Vec<(usize, usize)> = DIRS
                .iter()
                .map(|dir| ipq_tc_attachments(&lab.node, "qpa", *dir))
                .collect();
            Ok((left == [(0, 0), (0, 0)]).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let still: Vec<Filter> = DIRS
        .iter()
        .flat_map(|dir| filters(&lab.node, "qpa", *dir))
        .collect();
    assert_eq!(still, foreign, "foreign filters after the rename");
    drop(agent);
}
