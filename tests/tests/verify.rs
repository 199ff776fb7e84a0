//! What no notification announces, caught by the verification (`verify_interval`): a TCX link
//! or the uplink's XDP link detached through its pin (`bpftool link detach pinned ...`). The
//! agent holds the link, so the link object outlives the detach, but no program runs: the
//! next verification finds it detached, a repair attaches ipq's program again, and the loss is
//! counted and published; `ipq status` says when the last verification ran.
//!
//! Needs root, bpffs and `target/debug/ipq-agent` on a kernel with TCX and XDP links (this
//! host); `cargo xtask test` provides them.

use std::{ffi::CString, net::IpAddr, os::unix::ffi::OsStrExt as _, path::Path, time::Duration};

use aya::programs::TcAttachType;
use ipq_api::{model::EventBody, EventHook, LostPart};
use ipq_tests::{
    api,
    attach::wait_tc_upgrades,
    attachments::{self, Attachment},
    lab::{poll, udp_burst, Agent, Lab, PEER_V4, POD_A_V4},
    raw_bpf::{
        bpf, detach_through_pin, foreign_program, foreign_program_first, BPF_LINK_UPDATE,
        BPF_OBJ_GET,
    },
};

fn lost(agent: &Agent, hook: &str) -> f64 {
    agent
        .metric(
            "ipq_datapath_attachments_lost_total",
            &[("hook", hook), ("what", "link")],
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn ipq_tcx_on_ingress(lab: &Lab) -> bool {
    attachments::tc(&lab.node, "vethpa", TcAttachType::Ingress)
        .expect("vethpa ingress")
        .iter()
        .any(|a| a.is_ipq() && matches!(a, Attachment::Tcx { .. }))
}

fn ipq_xdp_on_uplink(lab: &Lab) -> bool {
    attachments::xdp(&lab.node, "up0")
        .expect("up0 xdp")
        .is_some_and(|a| a.is_ipq())
}

#[test]
fn a_link_detached_through_its_pin_is_found_repaired_and_counted() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_on_tcx(&lab);
    assert!(ipq_tcx_on_ingress(&lab) && ipq_xdp_on_uplink(&lab));
    let links = lab.bpffs.path().join("links");
    let ifindex = |name| ipq_tests::lab::ifindex(&lab.node, name).expect("ifindex");

    // vethpa's ingress TCX link: the fenced pod's traffic passes until it is back.
    let before = lost(&agent, "tc_ingress");
    detach_through_pin(&links.join(format!("if{}-tcx-ingress", ifindex("vethpa"))));
    poll(
        "the detached TCX link repaired",
        Duration::from_secs(10),
        || {
            Ok(
                (lost(&agent, "tc_ingress") == before + 1.0 && ipq_tcx_on_ingress(&lab))
                    .then_some(()),
            )
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    let _ = POD_A_V4;

    // The uplink's XDP link.
    let before = lost(&agent, "xdp");
    detach_through_pin(&links.join(format!("if{}-xdp", ifindex("up0"))));
    poll(
        "the detached XDP link repaired",
        Duration::from_secs(10),
        || Ok((lost(&agent, "xdp") == before + 1.0 && ipq_xdp_on_uplink(&lab)).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));

    // Published, and the status says when the last verification ran.
    let events = api::events(&agent.api_socket()).expect("events");
    let links_lost: Vec<(&str, EventHook, bool)> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AttachmentLost {
                interface,
                hook,
                what: LostPart::Link,
                repaired,
                ..
            } => Some((interface.as_str(), *hook, *repaired)),
            _ => None,
        })
        .collect();
    assert_eq!(
        links_lost,
        [
            ("vethpa", EventHook::TcIngress, true),
            ("up0", EventHook::Xdp, true)
        ],
        "{events:?}"
    );
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("status")
        .json()
        .expect("status json");
    let verification = &status["verification"];
    assert!(verification["at"].is_string(), "{status}");
    assert!(
        verification["pins"].as_u64().is_some_and(|n| n >= 5),
        "links, maps and programs held: {verification}"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
}

/// `lab`'s agent, holding pod a's veth by TCX links (verifying every 200 ms), pod a fenced
/// and its traffic to the peer dropped.
fn fenced_on_tcx(lab: &Lab) -> Agent<'_> {
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "tcx",
        "--verify-interval",
        "200ms",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    wait_tc_upgrades(&agent);
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    agent
}

fn tcx_ingress_names(lab: &Lab) -> Vec<String> {
    attachments::tc(&lab.node, "vethpa", TcAttachType::Ingress)
        .expect("vethpa ingress")
        .iter()
        .filter(|a| matches!(a, Attachment::Tcx { .. }))
        .map(|a| a.prog_name().to_owned())
        .collect()
}

#[test]
fn a_program_put_before_ipqs_tcx_link_is_found_and_ipq_goes_first_again() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_on_tcx(&lab);
    let peer = IpAddr::from(PEER_V4);
    let before = lost(&agent, "tc_ingress");

    let vethpa = ipq_tests::lab::ifindex(&lab.node, "vethpa").expect("ifindex");
    // (Not checked right after: the next verification may already have put ipq's first.)
    let (prog, link) = lab.node.run(|| foreign_program_first(vethpa));
    poll("ipq's program first again", Duration::from_secs(10), || {
        let names = tcx_ingress_names(&lab);
        Ok((lost(&agent, "tc_ingress") == before + 1.0
            && names.first().is_some_and(|n| n.starts_with("ipq_tc")))
        .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(
        tcx_ingress_names(&lab),
        ["ipq_tc_ingress", "foreign"],
        "one ipq program, first; the other tool's stays"
    );
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    // SAFETY: the descriptors foreign_program_first returned, closed once.
    unsafe {
        libc::close(link);
        libc::close(prog);
    }
}

/// `BPF_LINK_UPDATE` through the link's pin: the link stays where it is, attached, and runs
/// `prog` from now on. No netlink notice announces it.
fn update_through_pin(path: &Path, prog: i32) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let mut attr = [0u8; 64];
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    let link = bpf(BPF_OBJ_GET, &attr).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(link as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(prog as u32).to_ne_bytes());
    let updated = bpf(BPF_LINK_UPDATE, &attr);
    // SAFETY: our own fd from BPF_OBJ_GET.
    unsafe { libc::close(link) };
    updated.unwrap_or_else(|e| panic!("updating {}: {e}", path.display()));
}

#[test]
fn a_tcx_link_updated_to_another_program_through_its_pin_gets_ipqs_back_and_is_counted() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_on_tcx(&lab);
    let peer = IpAddr::from(PEER_V4);
    let before = lost(&agent, "tc_ingress");

    let vethpa = ipq_tests::lab::ifindex(&lab.node, "vethpa").expect("ifindex");
    let link = lab
        .bpffs
        .path()
        .join(format!("links/if{vethpa}-tcx-ingress"));
    let prog = foreign_program();
    // ipq's own link, still first and attached, now runs a program that passes everything.
    update_through_pin(&link, prog);
    poll(
        "ipq's program back in its link",
        Duration::from_secs(10),
        || {
            Ok((lost(&agent, "tc_ingress") == before + 1.0
                && tcx_ingress_names(&lab) == ["ipq_tc_ingress"])
            .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    // SAFETY: the descriptor foreign_program returned, closed once.
    unsafe { libc::close(prog) };
}

/// The verification's look at ipq's netlink filters, on its own: a hook of the test's (in a
/// namespace no agent watches, so no notification repairs it first) carrying ipq's program as
/// ipq's filter, then that filter deleted.
#[test]
fn the_verification_sees_a_netlink_filter_gone_as_the_kernel_lists_it() {
    use aya::programs::{
        tc::{self, NlOptions, TcAttachOptions, TcHandle},
        SchedClassifier,
    };
    use ipq::{datapath::verify::missing_filters, paths::AttachPoint};
    use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};
    use std::collections::BTreeMap;

    let lab = Lab::new().expect("building the lab");
    let _agent = lab
        .start_agent(&["--workload", "vethp*", "--tc-attach", "netlink"])
        .expect("starting ipq-agent (it pins the programs)");
    lab.peer
        .ip(&["link", "add", "vq0", "type", "veth", "peer", "vq1"])
        .expect("a veth of the test's");
    lab.peer.ip(&["link", "set", "vq0", "up"]).expect("up");
    let program = lab.bpffs.path().join("progs/ipq_tc_ingress");
    lab.peer
        .run(|| -> anyhow::Result<()> {
            let mut prog = SchedClassifier::from_pin(&program)?;
            let _ = tc::qdisc_add_clsact("vq0");
            let id = prog.attach_with_options(
                "vq0",
                TcAttachType::Ingress,
                TcAttachOptions::Netlink(NlOptions {
                    priority: TC_FILTER_PRIORITY,
                    handle: TcHandle::from(TC_FILTER_HANDLE),
                    classid: None,
                }),
            )?;
            // Dropping the link object would delete the filter: it stays, as ipq's do.
            std::mem::forget(prog.take_link(id)?);
            Ok(())
        })
        .expect("ipq's program as ipq's filter on vq0");
    let ifindex = ipq_tests::lab::ifindex(&lab.peer, "vq0").expect("ifindex");
    let hooks = BTreeMap::from([(ifindex, vec![AttachPoint::TcxIngress])]);
    assert_eq!(lab.peer.run(|| missing_filters(&hooks)), vec![]);

    lab.peer
        .command("tc")
        .args(["filter", "del", "dev", "vq0", "ingress", "pref", "2"])
        .status()
        .expect("tc filter del");
    assert_eq!(
        lab.peer.run(|| missing_filters(&hooks)),
        vec![(ifindex, AttachPoint::TcxIngress)]
    );
}
