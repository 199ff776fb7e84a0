//! The CRI tier: ipq on the path the kubelet takes. containerd of the test's own (Debian's
//! 1.6, its CRI plugin, runc, cgroupfs) runs pods the way the kubelet asks it to, through a
//! kubelet-shaped CRI client (`ipq_tests::cri`); the node's conflist is `bridge` + `host-local`
//! with `ipq-cni` (and `ipq-ipam` around host-local) put in by `ipq-cni install --hold-ipam`
//! while containerd runs; the real agent beside it.
//!
//! A pod's whole life: `RunPodSandbox` runs the CNI ADD with the pod's namespace, name and uid
//! in `CNI_ARGS`, and the agent holds the address for that pod; the pod reaches its gateway;
//! `StopContainer` with the grace period, then `StopPodSandbox` (containerd kills the pause
//! container, then runs the CNI DEL, whose ipq-cni step drains, and bridge's step removes the
//! veth: quarantined), then `RemovePodSandbox`. The event feed has Active, then Draining, then
//! Quarantined, in that order; and host-local's allocation is held until the quarantine is over.

use std::{
    net::IpAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq::{
    api::model::EventBody,
    registry::{ConflictKind, StateName},
};
use ipq_tests::{
    cni::{host_local_allocations, AgentApi},
    cri::{stop_container_in_background, Cri},
    cri_node::{
        data_dir, free_early, gateway_neighbour, node, node_with, pings, pod_mac, run_pod,
        run_pod_with, BridgeWatch, Range, GATEWAY, NETWORK, SENDS_AND_IGNORES_SIGTERM,
    },
    lab::{poll, Lab},
};

use ipq_tests::lab::SHORT_QUARANTINE as QUARANTINE;

/// One address transition of the event feed: its sequence number, the state entered and the
/// sandbox (CNI container id) of the holder it names.
#[derive(Clone, Debug, PartialEq)]
struct Step {
    seq: u64,
    to: StateName,
    sandbox: Option<String>,
}

/// The address transitions the agent published for `addr`, oldest first.
fn feed(api: &AgentApi, addr: IpAddr) -> anyhow::Result<Vec<Step>> {
    let mut steps = Vec::new();
    api.runtime.block_on(api.client.events(false, |event| {
        if let EventBody::Transition {
            address,
            to,
            holder,
            ..
        } = event.body
        {
            if address == addr {
                steps.push(Step {
                    seq: event.seq,
                    to,
                    sandbox: holder.and_then(|h| h.container_id().map(str::to_owned)),
                });
            }
        }
        true
    }))?;
    Ok(steps)
}

/// The states `addr` entered, oldest first.
fn transitions(api: &AgentApi, addr: IpAddr) -> anyhow::Result<Vec<StateName>> {
    Ok(feed(api, addr)?.into_iter().map(|s| s.to).collect())
}

/// The sequence number of the last event published so far (0: none yet).
fn last_seq(api: &AgentApi) -> anyhow::Result<u64> {
    let mut last = 0;
    api.runtime.block_on(api.client.events(false, |event| {
        last = last.max(event.seq);
        true
    }))?;
    Ok(last)
}

#[test]
fn a_pods_whole_life_through_containerds_cri() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let (containerd, cri) = node(&lab)?;

    let a = run_pod(&cri, &containerd, "a")?;
    let view = api.wait_state(a.ip, StateName::Active)?;
    let holder = view.holder.as_ref().context("an active holder")?;
    ensure!(
        holder.container_id() == Some(a.sandbox.as_str()),
        "held for the sandbox {}: {holder:?}",
        a.sandbox
    );
    let pod = holder.pod().context("the pod as the kubelet named it")?;
    ensure!(
        pod.namespace == a.spec.namespace
            && pod.name == a.spec.name
            && pod.uid.as_deref() == Some(a.spec.uid.as_str()),
        "K8S_POD_* as sent: {pod:?}"
    );
    ensure!(pings(&cri, &a, GATEWAY)? == 3, "A reaches its gateway");

    cri.stop_container(&a.container, Duration::from_secs(2))?;
    // The sandbox (and its pause container, its netns, its veth) outlives the containers:
    // nothing reached the CNI yet.
    let view = api.get(a.ip)?.context("A's address")?;
    ensure!(
        view.state == StateName::Active,
        "A holds until StopPodSandbox: {view:?}"
    );
    let before_stop = last_seq(&api)?;
    cri.stop_pod_sandbox(&a.sandbox)?;
    let view = api.wait_state(a.ip, StateName::Quarantined)?;
    ensure!(
        view.previous_holder.as_ref().and_then(|h| h.container_id()) == Some(a.sandbox.as_str()),
        "quarantined with A's sandbox as the last holder: {view:?}"
    );
    cri.remove_pod_sandbox(&a.sandbox)?;
    ensure!(
        host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip),
        "host-local's allocation of {} is held during the quarantine",
        a.ip
    );

    // The feed in order, waited for (it is read while the short quarantine may already end:
    // a Free after the three is no failure). Draining comes at its step: within the kubelet's
    // StopPodSandbox (ipq-cni's DEL), for A's sandbox, after everything published by the time
    // StopContainer returned; the drain itself is not visible between the CNI DEL's two steps,
    // which containerd runs in one call.
    let steps = poll(
        "A's Active, Draining, Quarantined in the feed",
        Duration::from_secs(10),
        || {
            let steps = feed(&api, a.ip)?;
            Ok((steps.len() >= 3).then_some(steps))
        },
    )?;
    let states: Vec<StateName> = steps.iter().map(|s| s.to).collect();
    ensure!(
        states[..3]
            == [
                StateName::Active,
                StateName::Draining,
                StateName::Quarantined
            ]
            && states[3..].iter().all(|s| *s == StateName::Free),
        "the feed in order: {steps:?}"
    );
    ensure!(
        steps[0].seq <= before_stop && steps[1].seq > before_stop,
        "Active before StopPodSandbox (last seq {before_stop}), Draining in it: {steps:?}"
    );
    ensure!(
        steps[0].sandbox.as_deref() == Some(a.sandbox.as_str())
            && steps[1].sandbox.as_deref() == Some(a.sandbox.as_str()),
        "claimed and drained for A's sandbox: {steps:?}"
    );
    poll(
        "host-local's release after the quarantine",
        Duration::from_secs(30),
        || {
            Ok(
                (!host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip))
                    .then_some(()),
            )
        },
    )?;
    Ok(())
}

/// containerd SIGKILLed and started again while a pod runs (its shim and the pod live on):
/// ipq's view does not change, no drain is made up, the pod still works, and the restarted
/// containerd ends it the usual way.
#[test]
fn containerd_sigkilled_and_restarted_changes_nothing_in_ipq() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let (mut containerd, cri) = node(&lab)?;
    let a = run_pod(&cri, &containerd, "a")?;
    let before = api.wait_state(a.ip, StateName::Active)?;

    containerd.kill9_and_restart()?;
    let cri = Cri::connect(&containerd.socket())?;
    // The socket answers before the CRI has recovered its pods ("not initialized yet").
    let ip = poll(
        "the restarted CRI knowing A",
        Duration::from_secs(30),
        || Ok(cri.pod_ip(&a.sandbox).ok()),
    )?;
    ensure!(ip == a.ip, "the restarted containerd knows the pod at {ip}");
    ensure!(
        cri.ready_sandboxes()? == vec![a.sandbox.clone()],
        "the kubelet's relist finds A ready"
    );
    ensure!(pings(&cri, &a, GATEWAY)? == 3, "A still works");
    let after = api.get(a.ip)?.context("A's address is still held")?;
    ensure!(
        after.state == StateName::Active && after.holder == before.holder,
        "unchanged: {before:?} then {after:?}"
    );
    ensure!(
        transitions(&api, a.ip)? == vec![StateName::Active],
        "no drain made up by the restart"
    );

    cri.stop_container(&a.container, Duration::from_secs(2))?;
    cri.stop_pod_sandbox(&a.sandbox)?;
    api.wait_state(a.ip, StateName::Quarantined)?;
    cri.remove_pod_sandbox(&a.sandbox)?;
    Ok(())
}

/// What is spooled in `dir` (`del-*.json`, oldest first), as JSON.
fn spooled(dir: &Path) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("del-") && name.ends_with(".json") {
            let text = std::fs::read_to_string(entry.path())?;
            let json = serde_json::from_str(&text).with_context(|| format!("{name}: {text}"))?;
            files.push((name, json));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// ipq-agent SIGKILLed while containerd deletes one pod and is asked for another: the DEL
/// succeeds (ipq-cni spools the drain, ipq-ipam the release: both files are checked while the
/// agent is away), the new sandbox is refused ("try again later": the kubelet retries) rather
/// than run unclaimed, and once the agent is back it replays the spooled DEL: the spool is
/// consumed, A's address goes Draining (the DEL's drain, for A's sandbox) and then Quarantined,
/// with A's sandbox as the previous holder; the retried sandbox runs and is claimed, and no
/// interface is left unprotected.
#[test]
fn the_agent_restarted_while_pods_come_and_go_loses_no_del_and_leaves_no_pod_unprotected(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let (containerd, cri) = node(&lab)?;
    let a = run_pod(&cri, &containerd, "a")?;
    let b = run_pod(&cri, &containerd, "b")?;
    api.wait_state(a.ip, StateName::Active)?;
    api.wait_state(b.ip, StateName::Active)?;
    let state_dir = lab.work_dir().join("state");
    let (cni_spool, ipam_releases) = (
        ipq_fs::paths::cni_spool_dir(&state_dir),
        ipq_fs::paths::ipam_release_dir(&state_dir),
    );
    ensure!(
        spooled(&cni_spool)?.is_empty(),
        "nothing spooled while the agent runs"
    );

    agent.kill9();
    cri.stop_container(&a.container, Duration::from_secs(2))?;
    cri.stop_pod_sandbox(&a.sandbox)
        .context("StopPodSandbox's CNI DEL succeeds with the agent away")?;
    cri.remove_pod_sandbox(&a.sandbox)?;
    // The DEL is on disk, for A's sandbox and address, until an agent replays it. (containerd
    // may run the DEL more than once, a later one without the prevResult: each is A's.)
    let dels = spooled(&cni_spool)?;
    let of_a = |d: &serde_json::Value| {
        d["container_id"] == a.sandbox.as_str() && d["cni_ifname"] == "eth0"
    };
    ensure!(
        !dels.is_empty()
            && dels.iter().all(|(_, d)| of_a(d))
            && dels.iter().any(|(_, d)| {
                d["addresses"]
                    .as_array()
                    .is_some_and(|addrs| addrs.iter().any(|x| *x == a.ip.to_string().as_str()))
            }),
        "the spooled DELs in {} are A's ({}, {}): {dels:?}",
        cni_spool.display(),
        a.sandbox,
        a.ip
    );
    let releases = spooled(&ipam_releases)?;
    ensure!(
        releases
            .iter()
            .any(|(_, r)| r["containerId"] == a.sandbox.as_str()),
        "ipq-ipam held A's release in {}: {releases:?}",
        ipam_releases.display()
    );
    let refused = match run_pod(&cri, &containerd, "c") {
        Ok(c) => anyhow::bail!("C must not run unclaimed while the agent is away: {}", c.ip),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        refused.contains("try again") || refused.contains("unavailable"),
        "RunPodSandbox fails for the kubelet to retry: {refused}"
    );
    drop(agent);

    let agent = lab.start_agent(&QUARANTINE)?;
    let view = api
        .wait_state(a.ip, StateName::Quarantined)
        .context("the spooled DEL of A is replayed")?;
    ensure!(
        view.previous_holder.as_ref().and_then(|h| h.container_id()) == Some(a.sandbox.as_str()),
        "A's sandbox held it last: {view:?}"
    );
    poll("the spool consumed", Duration::from_secs(10), || {
        let left = spooled(&cni_spool)?;
        if left.is_empty() {
            Ok(Some(()))
        } else {
            anyhow::bail!("{left:?}")
        }
    })?;
    let replayed = format!("CNI spool: replayed the DEL of container {}", a.sandbox);
    ensure!(
        agent.log().contains(&replayed),
        "the agent says it replayed A's DEL ({replayed:?}):\n{}",
        agent.log()
    );
    // The restarted agent's feed: A drained for its sandbox (the replayed DEL: a veth found gone
    // without a DEL would go straight to Quarantined), then quarantined.
    let steps = poll(
        "A's Draining, Quarantined in the feed",
        Duration::from_secs(10),
        || {
            let steps = feed(&api, a.ip)?;
            Ok((steps.len() >= 2).then_some(steps))
        },
    )?;
    ensure!(
        steps[0].to == StateName::Draining
            && steps[0].sandbox.as_deref() == Some(a.sandbox.as_str())
            && steps[1].to == StateName::Quarantined,
        "A's transitions after the restart: Draining for its sandbox, then Quarantined: {steps:?}"
    );

    let c = run_pod(&cri, &containerd, "c").context("the kubelet's retry of C")?;
    let view = api.wait_state(c.ip, StateName::Active)?;
    ensure!(
        view.holder.as_ref().and_then(|h| h.container_id()) == Some(c.sandbox.as_str()),
        "C is claimed for its sandbox: {view:?}"
    );
    ensure!(c.ip != a.ip, "C does not get A's quarantined {}", a.ip);
    let b_view = api.get(b.ip)?.context("B is still held")?;
    ensure!(b_view.state == StateName::Active, "B untouched: {b_view:?}");
    poll("every interface protected", Duration::from_secs(10), || {
        let scrape = agent.scrape()?;
        let mut unprotected = 0.0;
        for hook in ["tc_ingress", "tc_egress"] {
            // A missing series fails the test: it must not read as "none unprotected".
            unprotected += scrape.get("ipq_datapath_unprotected_interfaces", &[("hook", hook)])?;
        }
        Ok((unprotected == 0.0).then_some(()))
    })?;
    ensure!(pings(&cri, &b, GATEWAY)? == 3, "B works");
    ensure!(pings(&cri, &c, GATEWAY)? == 3, "C works");
    Ok(())
}

/// The SwarmKit incident (moby/swarmkit#2407) as it happens on a node: the old pod's container
/// ignores SIGTERM and keeps its address through its grace period (the kubelet's
/// StopContainer waits it out), sending to its gateway all the while, when an allocator frees
/// that address early (here: host-local's allocation removed, its round-robin pointing at it
/// next) and the next pod is run.
///
/// Without ipq-ipam the new pod gets the old one's address; what the test holds ipq to:
/// - the API: the new pod's sandbox holds the address, the old pod's is fenced, and the early
///   reuse between the two is on record (`/v1/conflicts`), with ipq's map saying the same;
/// - the packets, seen from the peers' side: from the moment of the fence to the end of the
///   grace period, not one frame from the old pod's MAC with the address (IPv4 or ARP) enters
///   the bridge, where every peer and the gateway would get it, while the same counter saw
///   the old pod before and sees the new pod's frames after; the gateway resolves the address
///   to the new pod;
/// - that the old pod did keep sending: ipq's `ipq_dropped_packets_total{reason="fenced"}` rises
///   through the grace period, still in its second half, and the feed has a fenced sample from
///   the old pod's MAC.
///
/// (Without the fence, the old pod's pings could still go unanswered, the gateway's neighbour
/// entry pointing at the new pod, but they would enter the bridge: the bridge's count is what
/// tells a fence from that.)
///
/// With ipq-ipam the new pod gets another address, and the old one finishes undisturbed: its
/// frames keep reaching the bridge to the end, and nothing of it is dropped.
fn swarmkit_on_a_node(hold_ipam: bool) -> anyhow::Result<()> {
    const GRACE: Duration = Duration::from_secs(8);
    let lab = Lab::new()?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let (containerd, cri) = node_with(&lab, Range::TwoAddresses, hold_ipam)?;
    let old = run_pod_with(&cri, &containerd, "old", &SENDS_AND_IGNORES_SIGTERM)?;
    api.wait_state(old.ip, StateName::Active)?;
    ensure!(pings(&cri, &old, GATEWAY)? == 3, "the old pod works");
    let old_mac = pod_mac(&cri, &old)?;
    let bridge = BridgeWatch::new(&lab)?;
    bridge.watch("old", &old_mac, old.ip)?;
    poll(
        "the old pod's own sending seen at the bridge",
        Duration::from_secs(10),
        || Ok((bridge.frames("old")? > 0).then_some(())),
    )?;
    let fenced_drops = || {
        let (ingress, egress) = agent.fenced_drops();
        ingress + egress
    };

    // The kubelet stops the old pod's container with its grace period, on its own thread.
    let stop_started = Instant::now();
    let stopping = stop_container_in_background(&containerd.socket(), &old.container, GRACE);
    // The allocator errs: the old pod's address is free again and next in line.
    free_early(&lab, old.ip)?;

    let new = run_pod(&cri, &containerd, "new").context("the next pod runs at once")?;
    let new_mac = pod_mac(&cri, &new)?;
    let addr = old.ip;
    let (old_frames_at_fence, drops_at_fence) = if hold_ipam {
        ensure!(
            new.ip != old.ip,
            "with ipq-ipam the new pod gets another address, not {}",
            old.ip
        );
        ensure!(pings(&cri, &new, GATEWAY)? == 3, "the new pod works");
        let old_replies = pings(&cri, &old, GATEWAY)?;
        ensure!(
            old_replies == 3,
            "the old pod finishes undisturbed: {old_replies}/3"
        );
        (bridge.frames("old")?, fenced_drops())
    } else {
        ensure!(
            new.ip == addr,
            "host-local hands the old pod's {addr} to the new one, got {}",
            new.ip
        );
        let view = poll(
            "the new pod holding it, the old one fenced",
            Duration::from_secs(10),
            || {
                let view = api.get(addr)?.context("the address is held")?;
                let holder = view.holder.as_ref().and_then(|h| h.container_id());
                let fenced = view.fenced.as_ref().and_then(|h| h.container_id());
                Ok((view.state == StateName::Active
                    && holder == Some(new.sandbox.as_str())
                    && fenced == Some(old.sandbox.as_str()))
                .then_some(view))
            },
        )?;
        let (holder, fenced) = (
            view.holder.as_ref().context("a holder")?,
            view.fenced.as_ref().context("a fenced holder")?,
        );
        lab.maps().wait_entry(
            addr,
            Duration::from_secs(10),
            "the map: the new pod holds it, the old one fenced",
            |e| e.is_some_and(|e| e.holder == holder.ifindex && e.fenced == fenced.ifindex),
        )?;
        let conflicts = api.runtime.block_on(api.client.conflicts(None))?.conflicts;
        let conflict = conflicts
            .iter()
            .find(|c| {
                c.kind == ConflictKind::EarlyReuse
                    && c.address == addr
                    && c.old_holder.as_ref().and_then(|h| h.container_id())
                        == Some(old.sandbox.as_str())
                    && c.new_holder.as_ref().and_then(|h| h.container_id())
                        == Some(new.sandbox.as_str())
            })
            .with_context(|| {
                format!("an early_reuse of {addr} from old to new in {conflicts:#?}")
            })?;
        ensure!(
            conflict.policy == ipq_api::EarlyReusePolicy::FenceOld
                && conflict.outcome == ipq_api::ConflictOutcome::FencedOld,
            "{conflict:?}"
        );
        // The fence is in the map: from here on, nothing of the old pod may pass.
        let at_fence = (bridge.frames("old")?, fenced_drops());

        bridge.watch("new", &new_mac, addr)?;
        ensure!(pings(&cri, &new, GATEWAY)? == 3, "the new pod works");
        ensure!(
            bridge.frames("new")? >= 3,
            "the bridge counts the new pod's frames with {addr}"
        );
        let old_replies = pings(&cri, &old, GATEWAY)?;
        ensure!(
            old_replies == 0,
            "the old pod never reaches a peer with the new pod's address: {old_replies}/3"
        );
        ensure!(
            gateway_neighbour(&lab, addr)?.as_deref() == Some(new_mac.as_str()),
            "the gateway resolves {addr} to the new pod ({new_mac})"
        );
        at_fence
    };

    // Through the rest of the grace period: what reaches the bridge from the old pod, and what
    // ipq drops of it, sampled until the kubelet's StopContainer returns.
    let mut samples = Vec::new();
    while !stopping.is_finished() {
        samples.push((
            stop_started.elapsed(),
            bridge.frames("old")?,
            fenced_drops(),
        ));
        std::thread::sleep(Duration::from_millis(250));
    }
    let took = stopping
        .join()
        .map_err(|_| anyhow::anyhow!("the StopContainer thread panicked"))??;
    ensure!(
        took >= GRACE - Duration::from_secs(1),
        "the old container ignored SIGTERM through its grace period (stopped after {took:?})"
    );
    let second_half = samples
        .iter()
        .find(|(at, ..)| *at >= GRACE / 2)
        .with_context(|| format!("samples in the second half of the grace: {samples:?}"))?;
    let last = samples.last().context("samples")?;
    if hold_ipam {
        ensure!(
            last.1 > second_half.1 && second_half.1 >= old_frames_at_fence,
            "the old pod's frames keep reaching the bridge to the end: {samples:?}"
        );
        ensure!(
            last.2 == drops_at_fence,
            "nothing of the old pod is dropped: {samples:?}"
        );
    } else {
        ensure!(
            samples.iter().all(|s| s.1 == old_frames_at_fence),
            "not one frame of the old pod with {addr} entered the bridge after the fence \
             ({old_frames_at_fence} before it); (elapsed, frames, fenced drops): {samples:?}"
        );
        ensure!(
            last.2 > second_half.2 && second_half.2 > drops_at_fence,
            "the old pod kept sending through its grace period, and ipq dropped it as fenced \
             ({drops_at_fence} at the fence); (elapsed, frames, fenced drops): {samples:?}"
        );
        let mut sampled = false;
        api.runtime.block_on(api.client.events(false, |event| {
            if let EventBody::Sample {
                address,
                reason,
                src_mac,
                ..
            } = &event.body
            {
                sampled |= *address == addr
                    && *reason == ipq_api::SampleReason::Fenced
                    && *src_mac == old_mac;
            }
            !sampled
        }))?;
        ensure!(
            sampled,
            "the feed has a fenced sample of {addr} from the old pod's {old_mac}"
        );
    }
    cri.stop_pod_sandbox(&old.sandbox)?;
    cri.remove_pod_sandbox(&old.sandbox)?;
    Ok(())
}

#[test]
fn swarmkit_incident_without_ipq_ipam_the_new_pod_works_and_the_old_is_fenced() -> anyhow::Result<()>
{
    swarmkit_on_a_node(false)
}

#[test]
fn swarmkit_incident_with_ipq_ipam_the_new_pod_gets_another_address() -> anyhow::Result<()> {
    swarmkit_on_a_node(true)
}

/// A force delete whose kill fails (Cilium #29571's case): the pod's shim is SIGKILLed, so
/// containerd cannot kill the containers through it (its log says so: the task behind the dead
/// shim cannot be reached, "ttrpc: closed", and it cleans up after the shim instead); the
/// kubelet's StopPodSandbox (retried until it succeeds, as the kubelet does) and
/// RemovePodSandbox then go on. No stale holder stays reachable: the CNI DEL ran, the address
/// is quarantined, nothing answers on it, and the host-local allocation stays held. Once the
/// quarantine is over, a new pod is given the same address: it works, the node reaches it, it
/// holds the address in ipq with nobody fenced, and from the force delete to the end not one
/// frame from A's MAC with the address enters the bridge, while the new pod's do.
#[test]
fn a_force_delete_whose_kill_fails_leaves_no_stale_holder_reachable() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    // Two addresses: with A's taken again after its quarantine, the next pod can only get A's.
    let (containerd, cri) = node_with(&lab, Range::TwoAddresses, true)?;
    let a = run_pod(&cri, &containerd, "a")?;
    let other = run_pod(&cri, &containerd, "other")?;
    api.wait_state(a.ip, StateName::Active)?;
    let a_mac = pod_mac(&cri, &a)?;
    let bridge = BridgeWatch::new(&lab)?;
    bridge.watch("a", &a_mac, a.ip)?;
    ensure!(
        ipq_tests::lab::ping(&lab.node, a.ip, 3) == 3,
        "A answers before"
    );
    ensure!(bridge.frames("a")? >= 3, "the bridge counts A's replies");
    let a_pids = containerd.pids_of(&a.container);
    ensure!(!a_pids.is_empty(), "A's container runs");

    ensure!(containerd.kill_shim_of(&a.sandbox), "A's shim runs");
    let a_frames = bridge.frames("a")?;
    let first = cri.stop_pod_sandbox(&a.sandbox);
    let alive_after_first = containerd.pids_of(&a.container);
    // The kill through the shim failed: containerd could not reach A's tasks.
    poll(
        "containerd's log: A's tasks unreachable behind the dead shim",
        Duration::from_secs(10),
        || {
            let log = containerd.log();
            Ok(log
                .lines()
                .any(|l| {
                    l.contains("failed to get task exit status")
                        && (l.contains(&a.container) || l.contains(&a.sandbox))
                        && l.contains("ttrpc: closed")
                })
                .then_some(()))
        },
    )
    .with_context(|| {
        format!(
            "first StopPodSandbox: {first:?}; A's container processes after it: \
             {alive_after_first:?}"
        )
    })?;
    eprintln!(
        "A's kill failed (shim gone); the first StopPodSandbox: {first:?}; A's container \
         processes before it: {a_pids:?}, still alive right after it: {alive_after_first:?}"
    );
    poll(
        "StopPodSandbox, retried as the kubelet does",
        Duration::from_secs(60),
        || Ok(cri.stop_pod_sandbox(&a.sandbox).ok()),
    )?;
    cri.remove_pod_sandbox(&a.sandbox)?;

    api.wait_state(a.ip, StateName::Quarantined)?;
    ensure!(
        ipq_tests::lab::ping(&lab.node, a.ip, 3) == 0,
        "no stale holder answers on {}",
        a.ip
    );
    ensure!(
        host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip),
        "A's allocation is held through the quarantine"
    );
    poll("A's processes gone", Duration::from_secs(10), || {
        let left = containerd.pids_of(&a.container);
        let left_sandbox = containerd.pids_of(&a.sandbox);
        if left.is_empty() && left_sandbox.is_empty() {
            Ok(Some(()))
        } else {
            anyhow::bail!("container {left:?}, sandbox {left_sandbox:?}")
        }
    })?;

    // The quarantine ends; the next pod gets A's address.
    poll(
        "host-local's release of A's address after the quarantine",
        Duration::from_secs(30),
        || {
            Ok(
                (!host_local_allocations(&data_dir(&lab), NETWORK)?.contains_key(&a.ip))
                    .then_some(()),
            )
        },
    )?;
    let c = run_pod(&cri, &containerd, "c")?;
    ensure!(
        c.ip == a.ip,
        "the new pod gets A's {} (the other pod has {})",
        a.ip,
        other.ip
    );
    let view = poll("the new pod holding it", Duration::from_secs(10), || {
        let view = api.get(c.ip)?;
        Ok(view.filter(|v| {
            v.state == StateName::Active
                && v.holder.as_ref().and_then(|h| h.container_id()) == Some(c.sandbox.as_str())
        }))
    })?;
    ensure!(
        view.fenced.is_none(),
        "nobody else is fenced on it: {view:?}"
    );
    let c_mac = pod_mac(&cri, &c)?;
    bridge.watch("c", &c_mac, c.ip)?;
    ensure!(pings(&cri, &c, GATEWAY)? == 3, "the new pod works");
    ensure!(
        ipq_tests::lab::ping(&lab.node, c.ip, 3) == 3,
        "{} answers the node from the new pod",
        c.ip
    );
    ensure!(
        gateway_neighbour(&lab, c.ip)?.as_deref() == Some(c_mac.as_str()),
        "the gateway resolves {} to the new pod ({c_mac})",
        c.ip
    );
    ensure!(
        bridge.frames("c")? >= 3,
        "the bridge counts the new pod's frames"
    );
    let now = bridge.frames("a")?;
    ensure!(
        now == a_frames,
        "no frame from A's {a_mac} with {} entered the bridge after the force delete \
         ({a_frames} before, {now} now)",
        a.ip
    );
    Ok(())
}
