//! Issue 27: the held-release API tried as an adversary would, against the real agent and
//! Debian's host-local and bridge. (Only root may POST a release now: `api_cli`'s socket test
//! shows a member of `api_group` refused; these are root callers, or mistakes of root's.)
//! A release naming the network's own plugin as its delegate, or hostile names, is a 400
//! naming the field and nothing runs; an address the attachment's live holder does not hold is
//! a 409; a release naming a quarantined pod's attachment with some free address frees
//! nothing before that pod's quarantine ends; one naming no address waits `max_cooldown` from
//! its own time on an agent that has run longer than that; and the spool directory removed
//! under a running agent (even right after the DEL, before any scan) is written back and
//! still released, once, after the quarantine.

use std::{
    net::IpAddr,
    time::{Duration, Instant, SystemTime},
};

use anyhow::ensure;
use ipq::{api::client::ClientError, registry::StateName};
use ipq_cni::ipam::release::{now_unix_ms, HeldRelease};
use ipq_fs::paths;
use ipq_tests::{
    cni::{host_local_allocations, AgentApi, Chain},
    lab::{poll, Lab},
};
use serde_json::{json, Value};

use super::{
    add, bridge_chain, data_dir, deadline, held_releases, ptp_chain, state_dir, wait_for_release,
    Pod, QUARANTINE, RELEASE_WITHIN,
};

/// The lab's `--max-cooldown` in [`QUARANTINE`].
const MAX_COOLDOWN: Duration = Duration::from_secs(6);

/// What ipq-ipam would hand over for `pod`'s DEL on `chain`: `delegate_type` as given.
pub(super) fn release_of(
    chain: &Chain,
    pod: &Pod,
    delegate_type: &str,
    addresses: &[IpAddr],
) -> HeldRelease {
    let mut delegate_conf = chain.plugin_config(0, None);
    delegate_conf["ipam"] = delegate_conf["ipam"]["delegate"].clone();
    HeldRelease {
        network: Some(chain.name.clone()),
        cni_version: chain.cni_version.clone(),
        delegate_type: delegate_type.into(),
        delegate_conf,
        container_id: pod.attachment.container_id.clone(),
        ifname: pod.attachment.ifname.clone(),
        cni_args: None,
        cni_path: std::env::join_paths(&chain.path)
            .expect("the chain's CNI_PATH")
            .into_string()
            .expect("a UTF-8 CNI_PATH"),
        netns: Some(pod.attachment.netns.display().to_string()),
        addresses: addresses.to_vec(),
        // Now, as ipq-ipam stamps it (the agent stamps its own since issue 27).
        held_at_unix_ms: now_unix_ms(),
        held_at_boot: None,
    }
}

/// `release` POSTed as root: the HTTP status and message of its refusal, or None if stored.
pub(super) fn post(api: &AgentApi, release: &HeldRelease) -> anyhow::Result<Option<(u16, String)>> {
    match api.runtime.block_on(api.client.hold_release(release)) {
        Ok(_) => Ok(None),
        Err(ClientError::Api { status, error }) => Ok(Some((status, error.message))),
        Err(e) => Err(e.into()),
    }
}

/// Whether the pod's `eth0` still exists in its own netns.
fn pod_has_eth0(pod: &Pod) -> anyhow::Result<bool> {
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net={}", pod.attachment.netns.display()))
        .args(["ip", "-o", "link", "show", "eth0"])
        .output()?;
    Ok(out.status.success())
}

#[test]
fn a_release_naming_the_networks_plugin_or_hostile_names_is_refused_and_nothing_runs(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;

    // bridge's DEL with the live pod's netns and eth0 would cut it off: as ipq-ipam would
    // write it, and forged to look consistent.
    let as_written = release_of(&chain, &a, "bridge", &[]);
    let mut forged = as_written.clone();
    forged.delegate_conf["ipam"] = json!({"type": "bridge"});
    let huge_network = format!("net\n{}", "x\n".repeat(5 * 1024));
    let hostile: [(&str, HeldRelease); 5] = [
        ("delegateType", as_written),
        ("delegateType", forged),
        (
            "containerId",
            HeldRelease {
                container_id: "c\0ffee".into(),
                ..release_of(&chain, &a, "host-local", &[])
            },
        ),
        (
            "containerId",
            HeldRelease {
                container_id: "../../../../etc/passwd".into(),
                ..release_of(&chain, &a, "host-local", &[])
            },
        ),
        (
            "network",
            HeldRelease {
                network: Some(huge_network),
                ..release_of(&chain, &a, "host-local", &[])
            },
        ),
    ];
    for (field, release) in hostile {
        match post(&api, &release)? {
            Some((400, message)) => {
                ensure!(message.contains(field), "400 naming {field}: {message}")
            }
            other => anyhow::bail!("a release with a bad {field} must be a 400: {other:?}"),
        }
    }
    ensure!(held_releases(&lab)?.is_empty(), "nothing stored");
    ensure!(pod_has_eth0(&a)?, "the live pod keeps its eth0");
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "host-local still allocates {} to A: {allocations:?}",
        a.v4
    );
    Ok(())
}

#[test]
fn an_address_the_attachment_does_not_hold_is_refused() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    let other: IpAddr = "10.93.0.6".parse()?;
    let release = release_of(&chain, &a, "host-local", &[a.v4, other]);
    match post(&api, &release)? {
        Some((409, message)) => ensure!(
            message.contains("10.93.0.6") && message.contains(&a.v4.to_string()),
            "409 naming the foreign address and the held one: {message}"
        ),
        other => anyhow::bail!("an address A does not hold must be a 409: {other:?}"),
    }
    ensure!(held_releases(&lab)?.is_empty(), "nothing stored");
    Ok(())
}

/// What an upgrade leaves: allocations an older ipq-ipam made have no record. The agent is
/// stopped, the records removed, and the agent started again with `args`.
fn without_records<'l>(
    lab: &'l Lab,
    mut agent: ipq_tests::lab::Agent<'l>,
    args: &[&str],
) -> anyhow::Result<ipq_tests::lab::Agent<'l>> {
    agent.terminate()?;
    drop(agent);
    let dir = paths::ipam_allocation_dir(&state_dir(lab));
    ensure!(
        std::fs::read_dir(&dir)?.count() > 0,
        "the ADD recorded its allocation in {}",
        dir.display()
    );
    std::fs::remove_dir_all(&dir)?;
    lab.start_agent(args)
}

/// A's DEL is held, A quarantined; then a release names A's attachment with a free address.
/// host-local frees by container id and ifname, so running it would free A's address
/// mid-quarantine. With A's record that address is not its allocation's: a 409. Without one
/// (an allocation of an older ipq-ipam), and without ipq-cni in the chain (the registry knows
/// A's address from its host route only, not by container id), nothing at the door ties the
/// two: the release must wait for every address of the attachment's releases, A's included.
#[test]
fn a_release_naming_a_quarantined_pods_attachment_with_a_free_address_frees_nothing_early(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut chain = ptp_chain(&lab, "1.0.0")?;
    chain.plugins.truncate(1);
    // A quarantine that outlasts the agent's restart below.
    let mut args = QUARANTINE.to_vec();
    args[3] = "10s";
    args[7] = "12s";
    let agent = lab.start_agent(&args)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let free: IpAddr = "10.94.0.6".parse()?;
    let forged = release_of(&chain, &a, "host-local", &[free]);
    match post(&api, &forged)? {
        Some((409, message)) => ensure!(
            message.contains("10.94.0.6") && message.contains(&a.v4.to_string()),
            "409 naming the address and the allocation's: {message}"
        ),
        other => anyhow::bail!("an address not of A's recorded allocation is a 409: {other:?}"),
    }
    let not_before = deadline(&api, &a)?;
    let _agent = without_records(&lab, agent, &args)?;
    ensure!(
        post(&api, &forged)?.is_none(),
        "stored, as an unrecorded DEL"
    );
    ensure!(
        SystemTime::now() < not_before,
        "the release must be handed over mid-quarantine for this test to mean anything"
    );
    wait_for_release(&lab, &chain, &api, &a, not_before)
}

/// The agent has run longer than `max_cooldown` when a DEL without prevResult hands over a
/// release naming no address, of an unrecorded allocation of a pod the registry never saw (no
/// workload glob matches its interface): the release waits `max_cooldown` from its own time,
/// not from the agent's start.
#[test]
fn an_address_less_release_waits_max_cooldown_from_its_own_time() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut chain = bridge_chain(&lab, "1.0.0")?;
    // Without ipq-cni, which would tell the agent the pod's addresses.
    chain.plugins.truncate(1);
    let mut args = QUARANTINE.to_vec();
    args[1] = "nomatch*";
    let agent = lab.start_agent(&args)?;
    let a = add(&chain, "ia")?;
    let started = Instant::now();
    let _agent = without_records(&lab, agent, &args)?;
    poll(
        "the agent up longer than max_cooldown",
        RELEASE_WITHIN,
        || Ok((started.elapsed() > MAX_COOLDOWN + Duration::from_secs(1)).then_some(())),
    )?;
    let handed_over = SystemTime::now();
    chain.del(&a.attachment, None)?;
    let releases = held_releases(&lab)?;
    ensure!(
        releases.len() == 1 && releases[0].addresses.is_empty(),
        "one release naming no address: {releases:?}"
    );
    let not_before = handed_over + MAX_COOLDOWN;
    let early = poll("the address-less release", RELEASE_WITHIN, || {
        let held = host_local_allocations(&data_dir(&lab), &chain.name)?.contains_key(&a.v4);
        if held {
            return Ok(None);
        }
        Ok(Some(SystemTime::now() < not_before))
    })?;
    ensure!(
        !early,
        "host-local's DEL of {} ran before max_cooldown after the DEL",
        a.v4
    );
    Ok(())
}

/// `rm -rf state_dir/ipam-releases` under the running agent: the release is written back at
/// the next scan, counted, and still released once, after the quarantine.
#[test]
fn a_removed_spool_directory_is_rebuilt_and_nothing_leaks() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let not_before = deadline(&api, &a)?;
    // The releaser has seen it once it shows in `ipq get`.
    poll("ipq get showing the IPAM's hold", RELEASE_WITHIN, || {
        Ok(api.get(a.v4)?.and_then(|v| v.ipam_hold))
    })?;
    let dir = paths::ipam_release_dir(&state_dir(&lab));
    std::fs::remove_dir_all(&dir)?;
    poll("the release written back", RELEASE_WITHIN, || {
        let restored = agent.metric("ipq_ipam_spool_restored_total", &[])?;
        Ok((restored == 1.0 && held_releases(&lab)?.len() == 1).then_some(()))
    })?;
    let back: Vec<Value> = held_releases(&lab)?
        .iter()
        .map(|r| json!([r.container_id, r.addresses]))
        .collect();
    ensure!(
        back == [json!([a.attachment.container_id, [a.v4]])],
        "the same release: {back:?}"
    );
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    poll("no held release left", RELEASE_WITHIN, || {
        Ok(held_releases(&lab)?.is_empty().then_some(()))
    })?;
    Ok(())
}

/// Measured from outside before: `state_dir/ipam-releases` removed 0.1 s after a held DEL,
/// before the releaser's next scan had seen its file, lost the release (only files a scan had
/// seen were written back) and host-local kept the address for good. The release is
/// remembered from its answer: removed at once after the DEL, it is written back, and the
/// delegate's DEL still runs when the quarantine ends, not before.
#[test]
fn a_release_directory_removed_right_after_the_del_is_still_released() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let dir = paths::ipam_release_dir(&state_dir(&lab));
    std::fs::remove_dir_all(&dir)?;
    let not_before = deadline(&api, &a)?;
    poll("the release written back", RELEASE_WITHIN, || {
        let restored = agent.metric("ipq_ipam_spool_restored_total", &[])?;
        Ok((restored == 1.0 && held_releases(&lab)?.len() == 1).then_some(()))
    })?;
    ensure!(
        host_local_allocations(&data_dir(&lab), &chain.name)?.contains_key(&a.v4),
        "host-local still holds {} mid-quarantine",
        a.v4
    );
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    ensure!(
        !host_local_allocations(&data_dir(&lab), &chain.name)?.contains_key(&a.v4),
        "host-local's file for {} is gone",
        a.v4
    );
    poll("no held release left", RELEASE_WITHIN, || {
        Ok(held_releases(&lab)?.is_empty().then_some(()))
    })?;
    Ok(())
}
