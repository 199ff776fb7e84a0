//! `tc_attach = "auto"` on a kernel with TCX (this host): protect first, upgrade later. A cold
//! start over many workload veths is ready with every veth protected by ipq's netlink filter,
//! then each filter is swapped for a pinned TCX link in the background (the TCX link first, the
//! filter after it). Fenced traffic stays dropped while that happens, a SIGKILL in the middle of
//! it converges after the restart, and in the end every hook has exactly one ipq attachment: a
//! TCX link, with no ipq filter left and other tools' filters untouched.
//!
//! Attachments are counted with `tc` and the bpf syscall ([`ipq_tests::attachments`]), never
//! through the agent's own code. No timing is asserted.
//!
//! Needs root, bpffs, `tc` (iproute2) and `target/debug/ipq-agent`; `cargo xtask test`
//! provides all of them.

use std::{thread, time::Duration};

use ipq::datapath::attach::tc_filter::{Direction, Filter};
use ipq_tests::{
    api,
    attach::{filters, ipq_tc_attachments, link_pins, wait_tc_upgrades},
    flows::Flows,
    lab::{poll, Agent, Lab},
    netns::output_of,
};
use serde_json::Value;

const DIRS: [Direction; 2] = [Direction::Ingress, Direction::Egress];
const PODS: [&str; 2] = ["vethpa", "vethpb"];
const PENDING: &str = "ipq_datapath_tc_upgrades_pending";

fn args(mode: &'static str) -> Vec<&'static str> {
    vec![
        "--workload",
        "veth*",
        "--uplink",
        "up0",
        "--tc-attach",
        mode,
    ]
}

/// Adds `n` workload veths to the node in one `ip -batch`; returns their names, with the lab's
/// two pods.
fn add_veths(lab: &Lab, n: usize) -> Vec<String> {
    let mut ip = lab
        .routes()
        .spawn_veth_batch("vethu", "ipqu", n)
        .expect("adding the veths");
    let done = ip.wait().expect("ip -batch");
    assert!(done.success(), "ip -batch failed: {done}");
    let mut names: Vec<String> = (0..n).map(|i| format!("vethu{i}")).collect();
    names.extend(PODS.map(str::to_owned));
    names
}

fn status(agent: &Agent) -> Value {
    api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .and_then(|r| r.json())
        .unwrap_or_else(|e| panic!("GET /v1/status: {e:#}\n{}", agent.log()))
}

/// How many interfaces were still to move to TCX when the agent became ready (`started` in
/// `/v1/status`, recorded before any upgrade may run).
fn pending_at_start(agent: &Agent) -> usize {
    let pending = poll("the agent's started facts", Duration::from_secs(30), || {
        Ok(status(agent)["started"]["tc_upgrades_pending"].as_u64())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    usize::try_from(pending).expect("a count")
}

/// Every one of `names` is protected, per the agent, and no configured interface is not.
fn assert_all_protected(agent: &Agent, names: &[String], when: &str) -> Value {
    let status = status(agent);
    assert_eq!(status["tc_attach"], "netlink-then-tcx", "{when}: {status}");
    assert_eq!(status["unprotected"], 0, "{when}: {status}");
    assert_eq!(status["ready"], true, "{when}: {status}");
    let interfaces = status["interfaces"].as_array().expect("interfaces");
    for name in names {
        let iface = interfaces
            .iter()
            .find(|i| i["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{when}: {name} not in {status}"));
        assert_eq!(iface["protection"], "protected", "{when}: {iface}");
    }
    status
}

/// Each hook of each of `names` has at least one ipq attachment, counted by the kernel's tools:
/// (veths with a netlink filter left, veths with a TCX link) over all hooks.
fn assert_each_hook_held(lab: &Lab, names: &[String], when: &str) -> (usize, usize) {
    let (mut filters, mut links) = (0, 0);
    for name in names {
        for dir in DIRS {
            let (f, t) = ipq_tc_attachments(&lab.node, name, dir);
            assert!(
                f + t >= 1 && f <= 1 && t <= 1,
                "{when}: {name} {dir:?} has {f} ipq filters and {t} ipq TCX links"
            );
            filters += f;
            links += t;
        }
    }
    (filters, links)
}

/// The end state: on every hook of `names` exactly one ipq attachment, a pinned TCX link,
/// and no ipq filter; the agent says `tcx` for each and has nothing left to move.
fn assert_all_moved_to_tcx(lab: &Lab, agent: &Agent, names: &[String], when: &str) {
    wait_tc_upgrades(agent);
    for name in names {
        for dir in DIRS {
            assert_eq!(
                ipq_tc_attachments(&lab.node, name, dir),
                (0, 1),
                "{when}: {name} {dir:?} (ipq netlink filters, ipq TCX links)"
            );
        }
    }
    let pins = link_pins(lab.bpffs.path());
    assert_eq!(
        pins.iter().filter(|p| p.contains("tcx")).count(),
        2 * names.len(),
        "{when}: TC link pins"
    );
    assert_eq!(pins.iter().filter(|p| p.ends_with("-xdp")).count(), 1);
    let status = assert_all_protected(agent, names, when);
    for iface in status["interfaces"].as_array().expect("interfaces") {
        let want = if iface["name"] == "up0" { "xdp" } else { "tcx" };
        assert_eq!(iface["attachment"], want, "{when}: {iface}");
    }
}

#[test]
fn a_cold_start_is_ready_on_netlink_filters_and_a_sigkill_mid_upgrade_converges_to_one_tcx_link_per_hook(
) {
    const VETHS: usize = 200;
    let lab = Lab::new().expect("building the lab");
    let names = add_veths(&lab, VETHS);

    let mut first = lab.start_agent(&args("auto")).expect("starting ipq-agent");
    // Ready with every veth protected by its filter: readiness waited for no TCX link.
    assert_eq!(pending_at_start(&first), names.len(), "{}", first.log());
    let status = assert_all_protected(&first, &names, "at ready");
    let netlink = status["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter(|i| i["attachment"] == "netlink")
        .count();
    assert!(netlink > 0, "no interface on its netlink filter: {status}");

    // SIGKILL once some interfaces have moved, while the rest wait or are halfway.
    poll("upgrades under way", Duration::from_secs(120), || {
        let pending = first.metric(PENDING, &[])?;
        Ok((pending < names.len() as f64).then_some(pending))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", first.log()));
    first.kill9();
    let (filters, links) = assert_each_hook_held(&lab, &names, "after the SIGKILL");
    assert!(
        filters > 0 && links > 0,
        "killed mid-upgrade: {filters} hooks on filters, {links} on TCX links"
    );

    let second = lab
        .start_agent(&args("auto"))
        .expect("restarting ipq-agent");
    assert_all_protected(&second, &names, "restarted");
    assert!(
        pending_at_start(&second) > 0,
        "the filters left were adopted and queued again\n{}",
        second.log()
    );
    assert_all_moved_to_tcx(&lab, &second, &names, "after the restart");
}

/// Classic BPF `ret #0`: no match, classification goes on.
const NO_MATCH: &str = "1,6 0 0 0,";

#[test]
fn fenced_traffic_is_dropped_while_netlink_filters_move_to_tcx_and_foreign_filters_stay() {
    const VETHS: usize = 100;
    let lab = Lab::new().expect("building the lab");
    let names = add_veths(&lab, VETHS);
    // Another tool's filters on vethpa, after ipq's place (one before it would make vethpa
    // `bypassed` in netlink mode: tc_bypass.rs).
    output_of(
        lab.node
            .command("tc")
            .args(["qdisc", "add", "dev", "vethpa", "clsact"]),
    )
    .expect("tc qdisc add");
    for (hook, place) in [
        ("ingress", "pref 3 handle 1"),
        ("egress", "pref 49152 handle 7"),
    ] {
        let mut tc = lab.node.command("tc");
        tc.args(["filter", "add", "dev", "vethpa", hook])
            .args(place.split_whitespace())
            .args(["bpf", "bytecode", NO_MATCH]);
        output_of(&mut tc).unwrap_or_else(|e| panic!("tc filter add {hook}: {e:#}"));
    }
    let foreign = || -> Vec<Filter> {
        DIRS.iter()
            .flat_map(|dir| filters(&lab.node, "vethpa", *dir))
            .filter(|f| !f.is_ipq())
            .collect()
    };
    let before = foreign();
    assert_eq!(before.len(), 2, "{before:?}");

    // Every interface on ipq's netlink filter, pod a fenced, pod b registered.
    let mut first = lab
        .start_agent(&args("netlink"))
        .expect("starting ipq-agent in netlink mode");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let (filters_before, links_before) = assert_each_hook_held(&lab, &names, "netlink mode");
    assert_eq!((filters_before, links_before), (2 * names.len(), 0));

    // Traffic runs from before the auto-mode agent starts until after its last upgrade, so
    // the pods' own hooks move under it.
    let flows = Flows::start(&lab);
    thread::sleep(Duration::from_millis(200));
    first.kill9();
    let second = lab
        .start_agent(&args("auto"))
        .expect("starting ipq-agent in auto mode");
    assert_eq!(
        pending_at_start(&second),
        names.len(),
        "every filter adopted, then queued to move\n{}",
        second.log()
    );
    assert_all_moved_to_tcx(&lab, &second, &names, "after the upgrades");
    thread::sleep(Duration::from_millis(200));
    flows.stop_and_check(100, "while the filters moved to TCX");

    assert_eq!(foreign(), before, "other tools' filters after the upgrades");
    drop(second);
}
