//! Interfaces the configuration names that could not be attached: each must be retried until
//! it is protected, and meanwhile counted, named in `ipq status`, and keep `/readyz` from
//! claiming readiness.

use std::time::Duration;

use ipq::datapath::attach::tc_filter::Direction;
use ipq_tests::{
    api,
    attach::{filters, ipq_tc_attachments, wait_tc_upgrades},
    lab::{poll, Agent, Lab},
    netns::{output_of, NetNs},
};
use serde_json::Value;

const GAUGE: &str = "ipq_datapath_unprotected_interfaces";
const FAILURES: &str = "ipq_datapath_attach_failures_total";

fn run(ns: &NetNs, program: &str, args: &str) {
    let mut cmd = ns.command(program);
    cmd.args(args.split_whitespace());
    output_of(&mut cmd).unwrap_or_else(|e| panic!("{program} {args}: {e:#}"));
}

/// `/v1/status`'s entry for `ifname`.
fn interface_status(agent: &Agent, ifname: &str) -> anyhow::Result<Value> {
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)?.json()?;
    status["interfaces"]
        .as_array()
        .and_then(|list| list.iter().find(|i| i["name"] == ifname).cloned())
        .ok_or_else(|| anyhow::anyhow!("{ifname} not in /v1/status: {status}"))
}

/// Protected again: gauge at 0 on every hook, `/readyz` 200, `ifname` protected.
fn wait_protected(agent: &Agent, ifname: &str) {
    poll(
        "the interface retried and protected",
        Duration::from_secs(30),
        || {
            let unprotected: f64 = ["tc_ingress", "tc_egress", "xdp"]
                .iter()
                .map(|hook| agent.metric(GAUGE, &[("hook", hook)]))
                .sum::<anyhow::Result<f64>>()?;
            let (ready, _) = agent.readyz()?;
            let protection = interface_status(agent, ifname)?["protection"].clone();
            Ok((unprotected == 0.0 && ready == 200 && protection == "protected").then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", agent.log()));
}

/// Injected: another tool's filter in ipq's tc place on a new pod's veth / Holds: counted, named, not ready; retried and protected once it is gone.
///
/// Netlink mode; the veth gets a clsact and a u32 filter at ipq's priority under another name,
/// then is renamed into the workload glob. Its ingress is refused without touching that
/// filter, the interface is counted in the unprotected gauge and named with the error in
/// /readyz and `ipq status`; once the filter is gone the retry protects it (one ipq filter per
/// hook) and the agent is ready again.
#[test]
fn a_foreign_filter_in_ipqs_place_leaves_the_pod_unprotected_visibly_until_it_is_gone() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&["--workload", "vethp*", "--tc-attach", "netlink"])
        .expect("starting ipq-agent");
    run(
        &lab.node,
        "ip",
        "link add ipqtmp0 type veth peer name ipqtmp1",
    );
    run(&lab.node, "tc", "qdisc add dev ipqtmp0 clsact");
    run(
        &lab.node,
        "tc",
        "filter add dev ipqtmp0 ingress pref 2 u32 match ip src 255.255.255.255/32",
    );
    run(&lab.node, "ip", "link set ipqtmp0 name vethpc");
    run(&lab.node, "ip", "link set vethpc up");

    poll(
        "vethpc reported unprotected",
        Duration::from_secs(15),
        || {
            let gauge = agent.metric(GAUGE, &[("hook", "tc_ingress")])?;
            let (ready, body) = agent.readyz()?;
            Ok((gauge == 1.0 && ready == 503).then_some(body))
        },
    )
    .map(|body| {
        assert!(
            body.contains("vethpc") && body.contains("u32"),
            "/readyz: {body}"
        )
    })
    .unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", agent.log()));
    assert_eq!(agent.metric(GAUGE, &[("hook", "tc_egress")]).unwrap(), 0.0);
    assert!(agent.metric(FAILURES, &[("hook", "tc_ingress")]).unwrap() >= 1.0);
    let vethpc = interface_status(&agent, "vethpc").expect("status of vethpc");
    assert_eq!(vethpc["protection"], "failed", "{vethpc}");
    assert!(
        vethpc["error"].as_str().unwrap_or("").contains("u32"),
        "{vethpc}"
    );
    let cli = api::ipq(&agent.api_socket(), &["status"]).expect("ipq status");
    let text = cli.ok();
    assert!(
        text.contains("NOT PROTECTED") && text.contains("vethpc") && text.contains("failed"),
        "{text}"
    );
    // The other tool's filter is exactly as it was.
    let ingress = filters(&lab.node, "vethpc", Direction::Ingress);
    assert!(
        ingress.iter().any(|f| f.kind == "u32" && f.priority == 2),
        "{ingress:?}"
    );

    run(&lab.node, "tc", "filter del dev vethpc ingress pref 2");
    wait_protected(&agent, "vethpc");
    for dir in [Direction::Ingress, Direction::Egress] {
        assert_eq!(
            ipq_tc_attachments(&lab.node, "vethpc", dir),
            (1, 0),
            "vethpc {dir:?} (ipq netlink filters, ipq TCX programs)"
        );
    }
}

fn set_nofile(pid: u32, limit: libc::rlimit64) -> libc::rlimit64 {
    let mut old = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to rlimit structs; pid is our own child.
    let rc = unsafe { libc::prlimit64(pid as i32, libc::RLIMIT_NOFILE, &limit, &mut old) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    old
}

/// Injected: EMFILE (RLIMIT_NOFILE of 0: no new fd) when a new pod's veth appears / Holds: logged not protected; retried and protected once fds are back.
///
/// As when idle connections exhaust the fds (the hardening issue's H2, whose new pod was never
/// attached nor retried). The attach fails with EMFILE and is logged as not protected; once
/// fds are available again the retry attaches it (one TCX program per hook), the failure stays
/// counted, and the agent is ready.
#[test]
fn an_attach_that_meets_emfile_is_retried_until_the_pod_is_protected() {
    let lab = Lab::new().expect("building the lab");
    // A soft limit of 0: no new fd at all, whatever the agent closes meanwhile (a limit at
    // its lowest free fd left room as soon as anything of its own closed one, and the new
    // veth's attach found it).
    let agent = lab
        .start_agent(&["--workload", "vethp*", "--verify-interval", "1h"])
        .expect("starting ipq-agent");
    ipq_tests::attach::wait_tc_upgrades(&agent);
    let pid = agent.pid();
    let mut current = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer; a NULL new limit only reads.
    let rc = unsafe {
        libc::prlimit64(
            pid as i32,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut current,
        )
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    // Only the soft limit: raising a hard limit back needs CAP_SYS_RESOURCE.
    let old = set_nofile(
        pid,
        libc::rlimit64 {
            rlim_cur: 0,
            rlim_max: current.rlim_max,
        },
    );
    run(&lab.node, "ip", "link add vethpc type veth peer name ipqpc");
    run(&lab.node, "ip", "link set vethpc up");
    // Nothing may connect to the agent while it has no fd to spare: read its log instead.
    let logged = poll("the failed attach logged", Duration::from_secs(15), || {
        let log = agent.log();
        Ok(log
            .lines()
            .any(|l| {
                l.contains("vethpc") && l.contains("NOT PROTECTED") && l.contains("os error 24")
            })
            .then_some(()))
    });
    set_nofile(pid, old);
    logged.unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", agent.log()));

    wait_protected(&agent, "vethpc");
    assert!(agent.metric(FAILURES, &[("hook", "tc_ingress")]).unwrap() >= 1.0);
    // Protected by its netlink filter first, then moved to TCX.
    wait_tc_upgrades(&agent);
    for dir in [Direction::Ingress, Direction::Egress] {
        assert_eq!(
            ipq_tc_attachments(&lab.node, "vethpc", dir),
            (0, 1),
            "vethpc {dir:?} (ipq netlink filters, ipq TCX programs)"
        );
    }
}
