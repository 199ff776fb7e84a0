//! The registry owns all enforcement state: observation across restarts and a lost journal,
//! addresses the node holds itself, durability before answers, and a full registry.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{ensure, Context as _};
use ipq::{api::model::DrainAttachmentRequest, journal::JOURNAL_FILE};
use ipq_fs::{paths, spool};
use ipq_tests::{
    api::{request, HttpResponse},
    cni::{host_interface, Attachment, Chain},
    lab::{
        ifindex, map_entry, pod_a_and_peer, pod_a_traffic, poll, wait_for_entry, Agent, Lab,
        POD_A_V4, POD_A_V6, POD_B_LLADDR,
    },
    netns::NetNs,
};
use serde_json::{json, Value};

/// Datagrams per burst.
const N: usize = 20;
/// How long the agent may take to act on an event or a tick, on a loaded machine.
const SETTLE: Duration = Duration::from_secs(10);
/// Routing table of node sockets bound to vethpa.
const TABLE_VIA_A: u32 = 101;

fn socket(lab: &Lab) -> PathBuf {
    lab.work_dir().join("ipq.sock")
}

fn state_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("state")
}

fn wait_metric(agent: &Agent, name: &str, labels: &[(&str, &str)], ok: impl Fn(f64) -> bool) {
    agent
        .wait_metric(name, labels, SETTLE, "as expected", ok)
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Injected: `on_early_reuse = observe`, an early reuse of pod a's addresses (v4, v6) by pod
/// b, then a SIGTERM restart, then a restart with the journal deleted /
/// Holds: the old holder, observed only, delivers 20/20 both ways before and after each.
#[test]
fn observe_stays_observe_across_restarts_and_a_lost_journal() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--on-early-reuse",
        "observe",
    ];
    let mut agent = lab.start_agent(&args)?;
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    lab.routes()
        .route_by_oif("vethpa", TABLE_VIA_A, &[POD_A_V4.into(), POD_A_V6.into()])?;
    for (addr, _) in pod_a_and_peer() {
        wait_for_entry(&lab, addr, &map_entry("active", vethpa, 0), SETTLE);
        // Pod a terminates (its route withdrawn, its process still running) and its address
        // is handed to pod b at once.
        lab.routes().del_host_route("vethpa", addr)?;
        wait_for_entry(&lab, addr, &map_entry("draining", vethpa, 0), SETTLE);
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
        lab.routes().add_host_route("vethpb", addr, None)?;
        wait_for_entry(&lab, addr, &map_entry("active", vethpb, 0), SETTLE);
    }
    wait_metric(
        &agent,
        "ipq_conflicts_total",
        &[("kind", "early_reuse")],
        |v| v == 2.0,
    );
    let check = |when: &str| {
        for (addr, peer) in pod_a_and_peer() {
            assert_eq!(
                pod_a_traffic(&lab, addr, peer, N),
                (N, N),
                "{addr}, {when}: the old holder's early reuse is only observed"
            );
        }
    };
    check("before any restart");

    agent.terminate()?;
    let mut agent = lab.start_agent(&args)?;
    check("after a SIGTERM restart");

    agent.terminate()?;
    let journal = state_dir(&lab).join(JOURNAL_FILE);
    fs::remove_file(&journal).with_context(|| format!("removing {}", journal.display()))?;
    let agent = lab.start_agent(&args)?;
    check("after a restart without the journal");
    drop(agent);
    Ok(())
}

/// ptp with host-local over `ranges`, then ipq-cni (which claims what ptp gave out).
fn ptp_chain<'n>(
    lab: &'n Lab,
    name: &str,
    data_dir: &Path,
    ranges: Value,
) -> anyhow::Result<Chain<'n>> {
    let ptp = json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "dataDir": data_dir,
            "ranges": ranges,
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    });
    let ipq = json!({
        "type": "ipq-cni",
        "socket": socket(lab),
        "stateDir": lab.work_dir().join("cni-state"),
        "onUnavailable": "fail",
        "timeoutMs": 2000,
    });
    Chain::new(&lab.node, name, "1.0.0", vec![ptp, ipq])
}

fn get(lab: &Lab, addr: IpAddr) -> anyhow::Result<HttpResponse> {
    request(&socket(lab), "GET", &format!("/v1/addresses/{addr}"), None)
}

/// Injected: the Debian ptp plugin, dual-stack with host-local and ipq-cni, which puts its
/// IPv6 gateway on every host-side veth as a `/128` (`proto kernel`); then one real reuse of a
/// pod's two addresses (another IPAM hands them out again) / Holds: the gateway is never a holder (no conflict for new pods, never in the
/// registry) and the reuse counts exactly 2 early reuses.
#[test]
fn addresses_the_node_holds_are_never_holders() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent(&["--workload", "veth*"])?;
    let gateway: IpAddr = "fd93::1".parse()?;
    let ranges = json!([[{"subnet": "10.93.0.0/24"}], [{"subnet": "fd93::/64"}]]);
    let chain = ptp_chain(
        &lab,
        &format!("ipq-ptp6-{}", std::process::id()),
        &lab.work_dir().join("ipam"),
        ranges,
    )?;
    let mut pods = Vec::new();
    for role in ["p1", "p2", "p3"] {
        let ns = NetNs::new(role)?;
        let attachment = Attachment::new(format!("{role}{}", ns.name().replace('-', "")), &ns);
        let result = chain.add(&attachment)?;
        let host_if = host_interface(&result, None)?;
        let addrs = ipq_tests::cni::addresses(&result)?;
        ensure!(addrs.len() == 2, "dual-stack: {result}");
        let index = ifindex(&lab.node, &host_if)?;
        for addr in &addrs {
            wait_for_entry(&lab, *addr, &map_entry("active", index, 0), SETTLE);
        }
        pods.push((ns, attachment, result, addrs, index));
    }
    let node_has_it = lab.node.ip(&["-6", "route", "show", "table", "main"])?;
    ensure!(
        node_has_it.contains(&format!("{gateway} dev veth")),
        "ptp put the gateway on the veths as a route: {node_has_it}"
    );
    get(&lab, gateway)?.assert_error("the gateway", 404, "not_found", &[]);
    assert_eq!(
        agent.metric("ipq_conflicts_total", &[("kind", "early_reuse")])?,
        0.0,
        "three new pods on ptp are no early reuse; log:\n{}",
        agent.log()
    );

    // One real reuse: another IPAM hands pod 1's two addresses to a fourth pod.
    let (_, _, _, reused, _) = &pods[0];
    let (v4, v6) = (reused[0], reused[1]);
    let ranges = json!([
        [{"subnet": "10.93.0.0/24", "rangeStart": v4, "rangeEnd": v4}],
        [{"subnet": "fd93::/64", "rangeStart": v6, "rangeEnd": v6}],
    ]);
    let reusing = ptp_chain(
        &lab,
        &format!("ipq-ptp6r-{}", std::process::id()),
        &lab.work_dir().join("ipam-reuse"),
        ranges,
    )?;
    let ns = NetNs::new("p4")?;
    let attachment = Attachment::new(format!("p4{}", ns.name().replace('-', "")), &ns);
    let result = reusing.add(&attachment)?;
    ensure!(
        ipq_tests::cni::addresses(&result)? == *reused,
        "the second IPAM gave out pod 1's addresses: {result}"
    );
    let index = ifindex(&lab.node, &host_interface(&result, None)?)?;
    for addr in reused {
        wait_for_entry(&lab, *addr, &map_entry("active", index, pods[0].4), SETTLE);
    }
    let early_reuses = || agent.metric("ipq_conflicts_total", &[("kind", "early_reuse")]);
    poll("the reuse's early reuses counted", SETTLE, || {
        Ok((early_reuses()? >= 2.0).then_some(()))
    })?;
    assert_eq!(
        early_reuses()?,
        2.0,
        "one reuse of a dual-stack pod is two early reuses; log:\n{}",
        agent.log()
    );
    get(&lab, gateway)?.assert_error("the gateway", 404, "not_found", &[]);

    // Every pod leaves: the gateway is never quarantined.
    reusing.del(&attachment, Some(&result))?;
    for (_, attachment, result, _, _) in &pods {
        chain.del(attachment, Some(result))?;
    }
    // Every pod's veth gone and seen gone (its addresses quarantined): the gateway's routes on
    // them went in the same events.
    for (_, _, _, addrs, _) in &pods {
        for addr in addrs {
            poll(&format!("{addr} quarantined"), SETTLE, || {
                let view: Value = get(&lab, *addr)?.json()?;
                Ok((view["state"] == "quarantined").then_some(()))
            })?;
        }
    }
    get(&lab, gateway)?.assert_error("the gateway", 404, "not_found", &[]);
    Ok(())
}

/// A small tmpfs mounted over a directory for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> anyhow::Result<Tmpfs> {
        fs::create_dir_all(at)?;
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .context("running mount")?;
        ensure!(
            status.success(),
            "mount tmpfs on {}: {status}",
            at.display()
        );
        Ok(Tmpfs(at.to_owned()))
    }

    /// Writes zeros into `file` until the file system is full.
    fn fill(&self, file: &str) -> anyhow::Result<PathBuf> {
        use std::io::Write as _;
        let path = self.0.join(file);
        let mut out = fs::File::create(&path)?;
        let chunk = vec![0u8; 4096];
        loop {
            match out.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e.into()),
            }
        }
        // What the page cache accepted is on "disk": tmpfs has no more room.
        let _ = out.sync_all();
        Ok(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn claim(lab: &Lab, addrs: &[IpAddr], container: &str) -> anyhow::Result<HttpResponse> {
    let body = json!({
        "addresses": addrs,
        "holder": {"interface": "vethpa", "container_id": container, "cni_ifname": "eth0"},
        "source": "cni",
    });
    request(&socket(lab), "POST", "/v1/claims", Some(&body.to_string()))
}

/// Injected: the state directory's file system fills up (a small tmpfs, filled with zeros)
/// while claims and a spooled CNI DEL arrive, then frees up / Holds: nothing is answered 200
/// and no spool file is removed until what it changed is saved; the failures are counted;
/// `/readyz` and `ipq status` say changes cannot be saved, naming ENOSPC, and clear once
/// writes succeed; once space is back the claim is durable: a SIGKILL restart still knows its
/// container.
#[test]
fn nothing_is_answered_before_it_is_durable() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let state = Tmpfs::mount(&state_dir(&lab), "512k")?;
    let mut agent = lab.start_agent(&["--workload", "vethp*"])?;
    let addrs: Vec<IpAddr> = vec![POD_A_V4.into(), POD_A_V6.into()];
    let vethpa = ifindex(&lab.node, "vethpa")?;
    for addr in &addrs {
        wait_for_entry(&lab, *addr, &map_entry("active", vethpa, 0), SETTLE);
    }
    // A DEL spooled by ipq-cni, written before the disk fills into a directory the agent does
    // not read: moved into the spool later, it needs no new space (a rename).
    let spool_dir = paths::cni_spool_dir(&state.0);
    fs::create_dir_all(&spool_dir)?;
    let held = spool::spool(
        &state.0.join("held"),
        &DrainAttachmentRequest {
            container_id: "c0ffee".into(),
            cni_ifname: Some("eth0".into()),
            addresses: addrs.clone(),
        },
    )?;
    let filler = state.fill("filler")?;

    // The journal appends: a change may still fit in the slack of the file's last page, and
    // is then rightly saved and answered. New claims go on until one no longer fits.
    let mut saved_before_full = 0;
    let full = loop {
        let extra: IpAddr = Ipv4Addr::new(10, 77, 1, saved_before_full + 1).into();
        let answer = claim(&lab, &[extra], &format!("filler-{saved_before_full}"))?;
        if answer.status != 200 || saved_before_full == 200 {
            break answer;
        }
        saved_before_full += 1;
    };
    full.assert_error(
        "a claim once the journal's page is full",
        503,
        "unavailable",
        &["journal", "No space left"],
    );
    // The claim names the container of pod a: a change of identity only, to be saved.
    let answer = claim(&lab, &addrs, "c0ffee")?;
    answer.assert_error(
        "a claim on a full disk",
        503,
        "unavailable",
        &["journal", "No space left"],
    );
    wait_metric(&agent, "ipq_journal_write_failures_total", &[], |v| {
        v >= 1.0
    });
    wait_metric(&agent, "ipq_journal_unsaved_seconds", &[], |v| v > 0.0);
    // Not ready while nothing can be saved, naming why, in `/readyz` and `ipq status` alike.
    let (code, body) = agent.readyz()?;
    ensure!(
        code == 503 && body.contains("changes cannot be saved") && body.contains("No space left"),
        "/readyz while the state disk is full: {code} {body}"
    );
    let status = request(&socket(&lab), "GET", "/v1/status", None)?.json()?;
    let not_ready = status["not_ready"].as_str().unwrap_or_default();
    ensure!(
        status["ready"] == false
            && not_ready.contains("journal")
            && not_ready.contains("No space left"),
        "ipq status while the state disk is full: {status}"
    );

    // The spooled DEL arrives while the disk is full: it is replayed, but its file stays.
    let spooled = spool_dir.join(held.file_name().context("a spool file name")?);
    fs::rename(&held, &spooled)?;
    for addr in &addrs {
        wait_for_entry(&lab, *addr, &map_entry("draining", vethpa, 0), SETTLE);
    }
    // A save of the drain was tried after it and failed: the point where a file removed too
    // early would be gone.
    let failures = || agent.metric("ipq_journal_write_failures_total", &[]);
    let after_drain = failures()?;
    poll("a failed save after the drain", SETTLE, || {
        Ok((failures()? > after_drain).then_some(()))
    })?;
    ensure!(
        spooled.exists(),
        "the spooled DEL was removed although its drain was not saved; log:\n{}",
        agent.log()
    );

    // Space is back: the retry saves, the spool file goes, and the claim is answered.
    fs::remove_file(&filler)?;
    poll("the spooled DEL removed once saved", SETTLE, || {
        Ok((!spooled.exists()).then_some(()))
    })?;
    wait_metric(&agent, "ipq_journal_unsaved_seconds", &[], |v| v == 0.0);
    let answer = claim(&lab, &addrs, "c0ffee")?;
    ensure!(answer.status == 200, "claim once saved: {answer:?}");
    // Saved again: ready again, with no other event.
    poll("/readyz 200 once writes succeed", SETTLE, || {
        Ok((agent.readyz()?.0 == 200).then_some(()))
    })?;

    // SIGKILL: what was answered is what the journal brings back.
    agent.kill9();
    let _agent = lab.start_agent(&["--workload", "vethp*"])?;
    for addr in &addrs {
        let view = get(&lab, *addr)?.json()?;
        ensure!(
            view["holder"]["container_id"] == "c0ffee",
            "{addr} after a SIGKILL restart: {view}"
        );
    }
    Ok(())
}

/// Injected: a registry of capacity 4, full with the lab's four pod addresses, then a fifth
/// address routed to pod b / Holds: the fifth is counted unprotected, and is claimed (and
/// enforced) as soon as one entry frees, with no other event.
#[test]
fn a_claim_refused_for_a_full_registry_is_made_when_space_frees() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent(&["--workload", "vethp*", "--capacity", "4"])?;
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    wait_for_entry(
        &lab,
        POD_A_V4.into(),
        &map_entry("active", vethpa, 0),
        SETTLE,
    );
    wait_metric(&agent, "ipq_registry_entries", &[], |v| v == 4.0);

    let fifth: IpAddr = "10.77.0.9".parse()?;
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, fifth)?;
    lab.routes().add_host_route("vethpb", fifth, None)?;
    wait_metric(&agent, "ipq_addresses_unprotected", &[], |v| v == 1.0);
    ensure!(
        lab.maps().entry(fifth)?.is_none(),
        "the full registry took {fifth}"
    );

    let freed = request(
        &socket(&lab),
        "POST",
        &format!("/v1/addresses/{POD_A_V6}/release"),
        Some(r#"{"force":true}"#),
    )?;
    ensure!(freed.status == 200, "release: {freed:?}");
    wait_for_entry(&lab, fifth, &map_entry("active", vethpb, 0), SETTLE);
    wait_metric(&agent, "ipq_addresses_unprotected", &[], |v| v == 0.0);
    Ok(())
}
