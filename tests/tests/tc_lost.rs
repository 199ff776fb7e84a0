//! Another tool takes ipq's netlink filter off a fenced pod's veth (`tc_attach = "netlink"`,
//! what every 5.10 and 6.1 node gets): `tc qdisc del dev <veth> clsact` (felix switching its
//! eBPF dataplane off, a cleanup script) or `tc filter del ... pref 2`. The kernel's TC
//! notification brings ipq's filter back at once; the loss is counted
//! (`ipq_datapath_attachments_lost_total`) and published on `/v1/events`, and the fenced pod's
//! datagrams that got through meanwhile stay within the 100 ms target.
//!
//! Needs root, bpffs, `tc` (iproute2) and `target/debug/ipq-agent`; `cargo xtask test`
//! provides all of them (and runs this on 5.10 and 6.1 in the kernel tier).

use std::{net::IpAddr, time::Duration};

use ipq::datapath::attach::tc_filter::Direction;
use ipq_api::{model::EventBody, EventHook, LostPart};
use ipq_tests::{
    api,
    attach::ipq_tc_attachments,
    flows::{FlowCount, Flows},
    lab::{poll, Agent, Lab, POD_B_V4},
    netns::output_of,
};

const ARGS: [&str; 6] = [
    "--workload",
    "vethp*",
    "--uplink",
    "up0",
    "--tc-attach",
    "netlink",
];

/// The flows send one datagram every 2 ms: 100 ms of a lifted fence is 50 of them.
const WITHIN_100_MS: u64 = 50;

fn lost(agent: &Agent, hook: &str, what: &str) -> f64 {
    agent
        .metric(
            "ipq_datapath_attachments_lost_total",
            &[("hook", hook), ("what", what)],
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// ipq's filter is on both hooks of pod a's veth again, as `tc` reads them.
fn filters_back(lab: &Lab) -> anyhow::Result<Option<()>> {
    let back = [Direction::Ingress, Direction::Egress]
        .into_iter()
        .all(|dir| ipq_tc_attachments(&lab.node, "vethpa", dir) == (1, 0));
    Ok(back.then_some(()))
}

/// Runs `tc args` on the node while pod a (fenced) and pod b send, and waits for the loss to be
/// counted on `hooks` as `what` and for ipq's filters to be back; then checks what got through.
fn take_off_and_repair(lab: &Lab, agent: &Agent, args: &[&str], hooks: &[&str], what: &str) {
    let before: Vec<f64> = hooks.iter().map(|h| lost(agent, h, what)).collect();
    let flows = Flows::start(lab);
    output_of(lab.node.command("tc").args(args)).expect("tc");
    let counted = poll("the loss counted", Duration::from_secs(10), || {
        let now: Vec<f64> = hooks.iter().map(|h| lost(agent, h, what)).collect();
        Ok(now
            .iter()
            .zip(&before)
            .all(|(now, before)| *now == before + 1.0)
            .then_some(()))
    });
    counted.unwrap_or_else(|e| panic!("tc {args:?}: {e:#}\n{}", agent.log()));
    poll("ipq's filters back", Duration::from_secs(10), || {
        filters_back(lab)
    })
    .unwrap_or_else(|e| panic!("tc {args:?}: {e:#}\n{}", agent.log()));
    for FlowCount { src, sent, got } in flows.stop() {
        if src == IpAddr::from(POD_B_V4) {
            assert!(got > sent / 2, "pod b: {got} of {sent} delivered");
        } else {
            assert!(
                got <= WITHIN_100_MS,
                "tc {args:?}: fenced {src} delivered {got} of {sent}, more than 100 ms' worth"
            );
        }
    }
}

#[test]
fn a_deleted_clsact_or_filter_is_put_back_at_once_counted_and_published() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&ARGS).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    poll("ipq's filters on pod a", Duration::from_secs(10), || {
        filters_back(&lab)
    })
    .expect("attached");

    take_off_and_repair(
        &lab,
        &agent,
        &["qdisc", "del", "dev", "vethpa", "clsact"],
        &["tc_ingress", "tc_egress"],
        "qdisc",
    );
    take_off_and_repair(
        &lab,
        &agent,
        &["filter", "del", "dev", "vethpa", "ingress", "pref", "2"],
        &["tc_ingress"],
        "filter",
    );
    take_off_and_repair(
        &lab,
        &agent,
        &["filter", "del", "dev", "vethpa", "egress", "pref", "2"],
        &["tc_egress"],
        "filter",
    );

    // Each loss is an event naming the interface, the hook and what went, repaired.
    let events = api::events(&agent.api_socket()).expect("GET /v1/events");
    let seen: Vec<(EventHook, LostPart, bool)> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AttachmentLost {
                interface,
                hook,
                what,
                repaired,
                ..
            } => {
                assert_eq!(interface, "vethpa", "{e:?}");
                Some((*hook, *what, *repaired))
            }
            _ => None,
        })
        .collect();
    let want = [
        (EventHook::TcIngress, LostPart::Qdisc),
        (EventHook::TcEgress, LostPart::Qdisc),
        (EventHook::TcIngress, LostPart::Filter),
        (EventHook::TcEgress, LostPart::Filter),
    ];
    for (hook, what) in want {
        assert!(
            seen.contains(&(hook, what, true)),
            "no repaired {hook} {what} loss in {seen:?}"
        );
    }
    assert_eq!(seen.len(), want.len(), "{seen:?}");

    assert_protected(&agent);
}

/// Back to protected: the gauge and readiness say so.
fn assert_protected(agent: &Agent) {
    assert_eq!(
        agent
            .metric("ipq_datapath_unprotected_interfaces", &[])
            .expect("gauge"),
        0.0
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
}

/// The `/v1/status` entry of pod a's veth.
fn vethpa_status(agent: &Agent) -> serde_json::Value {
    let status =
        api::request(&agent.api_socket(), "GET", "/v1/status", None).expect("GET /v1/status");
    let status: serde_json::Value = serde_json::from_str(&status.body).expect("status JSON");
    status["interfaces"]
        .as_array()
        .and_then(|list| list.iter().find(|i| i["name"] == "vethpa").cloned())
        .unwrap_or_else(|| panic!("no vethpa in {status}"))
}

/// Another tool deletes clsact and puts an old-style `ingress` qdisc in its place. The kernel would take both of
/// ipq's filters into that qdisc's one block, where the egress one never runs: ipq refuses, and
/// says unprotected (status, gauge, `/readyz`) until the place is clsact's again.
#[test]
fn a_loss_that_cannot_be_put_back_is_unprotected_and_not_ready_until_it_can() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(&ARGS).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    poll("ipq's filters on pod a", Duration::from_secs(10), || {
        filters_back(&lab)
    })
    .expect("attached");

    // The agent is stopped for the swap, so that its repair cannot get in between the two
    // commands (under QEMU it always did); the kernel's notices wait in its socket.
    let pid = agent.pid() as i32;
    // SAFETY: signals the agent this test started, which has not been reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
    let swapped = output_of(
        lab.node
            .command("tc")
            .args(["qdisc", "del", "dev", "vethpa", "clsact"]),
    )
    .and_then(|_| {
        output_of(
            lab.node
                .command("tc")
                .args(["qdisc", "add", "dev", "vethpa", "ingress"]),
        )
    });
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT");
    swapped.expect("swapping clsact for an ingress qdisc");

    poll("vethpa unprotected", Duration::from_secs(10), || {
        let unprotected = agent.metric("ipq_datapath_unprotected_interfaces", &[])?;
        Ok((unprotected >= 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let status = vethpa_status(&agent);
    assert_eq!(status["protection"], "failed", "{status}");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains("`ingress` qdisc")),
        "{status}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("vethpa"), "{body}");
    // Nothing of ipq's went into the foreign qdisc's block (where tc lists it on both hooks).
    assert_eq!(
        ipq_tc_attachments(&lab.node, "vethpa", Direction::Ingress).0,
        0,
        "ipq put its filter into the ingress qdisc's block"
    );

    // The place is clsact's again: the retry puts ipq's filters back.
    output_of(
        lab.node
            .command("tc")
            .args(["qdisc", "del", "dev", "vethpa", "ingress"]),
    )
    .expect("tc qdisc del ingress");
    poll("ipq's filters back", Duration::from_secs(20), || {
        filters_back(&lab)
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    poll("vethpa protected", Duration::from_secs(10), || {
        Ok((vethpa_status(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_protected(&agent);
}
