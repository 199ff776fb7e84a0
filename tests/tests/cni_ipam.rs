//! `ipq-ipam` wrapping Debian's real `host-local` under the real `bridge` and `ptp` (with
//! `ipq-cni` chained after them), run as a runtime runs them in the lab's node namespace: ADD
//! and CHECK go through to host-local, bad config is named, and a DEL never frees host-local's
//! allocation (the release is held durably for the agent), so the range is exhausted rather than
//! wrapped onto the deleted pod's address. The agent runs host-local's DEL once the address's
//! quarantine is over, never before (also across a SIGKILL, and with the agent away during the
//! DEL), and the address is handed out again. A second delegate, Debian's `static`, gets the
//! same holds, and so does Debian's `dhcp` with dnsmasq (`cni_ipam/dhcp.rs`). GC and STATUS:
//! `cni_ipam/gc_status.rs`; the agent's delegate DEL refused outside its trusted CNI bin dirs,
//! and a failing one retried: `cni_ipam/delegate_del.rs`; a range exhausted by holds:
//! `cni_ipam/pressure.rs`; the SwarmKit replay with and without ipq-ipam: `cni_ipam/swarmkit.rs`;
//! ADD, CHECK and DEL at spec 1.1.0 over a 1.1.0-speaking delegate: `cni_ipam/spec_1_1.rs`;
//! the release API tried as an adversary (issue 27): `cni_ipam/adversary.rs`; the records of
//! allocations a release completes: `cni_ipam/records.rs`.

use std::{
    net::IpAddr,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use anyhow::{ensure, Context as _};
use ipq::registry::StateName;
use ipq_cni::ipam::release::HeldRelease;
use ipq_fs::{paths, spool};
use ipq_tests::{
    cni::{addresses, host_local_allocations, ipq_ipam, AgentApi, Attachment, Chain},
    lab::{poll, Lab},
    netns::NetNs,
};
use serde_json::{json, Value};

#[path = "cni_ipam/adversary.rs"]
mod adversary;
#[path = "cni_ipam/burst.rs"]
mod burst;
#[path = "cni_ipam/delegate_del.rs"]
mod delegate_del;
#[path = "cni_ipam/dhcp.rs"]
mod dhcp;
#[path = "cni_ipam/gc_status.rs"]
mod gc_status;
#[path = "cni_ipam/pressure.rs"]
mod pressure;
#[path = "cni_ipam/records.rs"]
mod records;
#[path = "cni_ipam/spec_1_1.rs"]
mod spec_1_1;
#[path = "cni_ipam/swarmkit.rs"]
mod swarmkit;

const BRIDGE: &str = "cniipam0";

fn data_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("cni-data")
}

fn state_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("state")
}

/// A /29: host-local hands out .2 to .6 (.1 is the gateway), round-robin.
fn wrapped_host_local(lab: &Lab, subnet: &str) -> Value {
    let host_local = json!({
        "type": "host-local",
        "dataDir": data_dir(lab),
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    });
    ipq_ipam(
        host_local,
        &lab.work_dir().join("ipq.sock"),
        &state_dir(lab),
    )
}

fn ipq_cni(lab: &Lab) -> Value {
    json!({
        "type": "ipq-cni",
        "socket": lab.work_dir().join("ipq.sock"),
        "stateDir": state_dir(lab),
        "timeoutMs": 2000,
    })
}

fn bridge_chain<'l>(lab: &'l Lab, version: &str) -> anyhow::Result<Chain<'l>> {
    let bridge = json!({
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipMasq": false,
        "ipam": wrapped_host_local(lab, "10.93.0.0/29"),
    });
    let name = format!("ipam-br-{}", std::process::id());
    Chain::new(&lab.node, name, version, vec![bridge, ipq_cni(lab)])
}

fn ptp_chain<'l>(lab: &'l Lab, version: &str) -> anyhow::Result<Chain<'l>> {
    let ptp = json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": wrapped_host_local(lab, "10.94.0.0/29"),
    });
    let name = format!("ipam-ptp-{}", std::process::id());
    Chain::new(&lab.node, name, version, vec![ptp, ipq_cni(lab)])
}

struct Pod {
    _ns: NetNs,
    attachment: Attachment,
    result: Value,
    v4: IpAddr,
}

impl Pod {
    /// The pod `result` added in `ns`, with the first address of that result.
    fn added(ns: NetNs, attachment: Attachment, result: Value) -> anyhow::Result<Pod> {
        let v4 = *addresses(&result)?
            .first()
            .with_context(|| format!("an address in {result}"))?;
        Ok(Pod {
            _ns: ns,
            attachment,
            result,
            v4,
        })
    }
}

fn add(chain: &Chain, role: &str) -> anyhow::Result<Pod> {
    let ns = NetNs::new(role)?;
    let attachment = Attachment::new(format!("{role}{}", ns.name().replace('-', "")), &ns);
    let result = chain.add(&attachment)?;
    Pod::added(ns, attachment, result)
}

fn held_releases(lab: &Lab) -> anyhow::Result<Vec<HeldRelease>> {
    let dir = paths::ipam_release_dir(&state_dir(lab));
    Ok(spool::pending_of::<HeldRelease>(&dir)?
        .into_iter()
        .map(|s| s.request)
        .collect())
}

/// ADD goes through to host-local, CHECK passes, and the deleted pod's address stays allocated
/// in host-local (its release held) while the rest of the /29 is handed out and exhausted.
fn deleted_pods_address_is_never_handed_out(lab: &Lab, chain: &Chain) -> anyhow::Result<()> {
    let a = add(chain, "ia")?;
    ensure!(
        a.result["cniVersion"] == chain.cni_version.as_str(),
        "the result speaks the chain's version: {}",
        a.result
    );
    let allocations = host_local_allocations(&data_dir(lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "host-local allocated {} to A: {allocations:?}",
        a.v4
    );
    chain.check(&a.attachment, &a.result)?;

    chain.del(&a.attachment, Some(&a.result))?;
    let allocations = host_local_allocations(&data_dir(lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "the DEL must not free A's {} in host-local: {allocations:?}",
        a.v4
    );
    let releases = held_releases(lab)?;
    ensure!(releases.len() == 1, "one held release: {releases:?}");
    let release = &releases[0];
    ensure!(
        release.container_id == a.attachment.container_id
            && release.ifname == "eth0"
            && release.addresses == vec![a.v4]
            && release.delegate_type == "host-local"
            && release.network.as_deref() == Some(chain.name.as_str())
            && release.cni_version == chain.cni_version
            && release.delegate_conf["ipam"]["type"] == "host-local",
        "the release names what the delegate's DEL needs: {release:?}"
    );

    // Four addresses left: .3 to .6. Round-robin would bring A's .2 back after them.
    exhaust_the_range(chain, &a).map(drop)
}

/// Adds B to E (the /29's four other addresses), none of which may get A's held address, then
/// F, which host-local must refuse as exhausted (passed through ipq-ipam).
fn exhaust_the_range(chain: &Chain, a: &Pod) -> anyhow::Result<Vec<Pod>> {
    let mut others = Vec::new();
    for role in ["ib", "ic", "id", "ie"] {
        let pod = add(chain, role)?;
        ensure!(pod.v4 != a.v4, "{role} got A's held {}", a.v4);
        others.push(pod);
    }
    let err = match add(chain, "if") {
        Ok(pod) => anyhow::bail!("the /29 must be exhausted, yet F got {}", pod.v4),
        Err(e) => e,
    };
    ensure!(
        format!("{err:#}").contains("no IP addresses available"),
        "host-local's own exhaustion, passed through ipq-ipam: {err:#}"
    );
    Ok(others)
}

#[test]
fn bridge_with_wrapped_host_local_holds_the_deleted_pods_address() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*"])?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    deleted_pods_address_is_never_handed_out(&lab, &chain)
}

#[test]
fn ptp_with_wrapped_host_local_holds_the_deleted_pods_address() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*"])?;
    let chain = ptp_chain(&lab, "0.4.0")?;
    deleted_pods_address_is_never_handed_out(&lab, &chain)
}

#[test]
fn bad_ipam_config_is_a_cni_error_naming_the_key() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut chain = bridge_chain(&lab, "1.0.0")?;
    chain.plugins.truncate(1);
    let ns = NetNs::new("ibad")?;
    let attachment = Attachment::new("ibad", &ns);
    for (ipam, key) in [
        (json!({"type": "ipq-ipam"}), "ipam.delegate"),
        (
            json!({"type": "ipq-ipam", "delegate": {"type": "no-such-ipam"}}),
            "ipam.delegate.type",
        ),
        (
            json!({"type": "ipq-ipam", "delegate": {"type": "host-local"}, "sockett": "/x"}),
            "ipam.sockett",
        ),
    ] {
        chain.plugins[0]["ipam"] = ipam.clone();
        let err = match chain.add(&attachment) {
            Ok(result) => anyhow::bail!("ADD with ipam {ipam} must fail: {result}"),
            Err(e) => e,
        };
        ensure!(
            err.code == Some(7) && err.msg.contains(&format!("{key:?}")),
            "bridge passes on ipq-ipam's code 7 naming {key}: {err}"
        );
    }
    Ok(())
}

// A quarantine that outlasts filling the /29 (a few ADDs) and ends within the test.
use ipq_tests::lab::SHORT_QUARANTINE as QUARANTINE;

/// Bound on the wait for the release: the quarantine plus the releaser's poll, loaded machine.
const RELEASE_WITHIN: Duration = Duration::from_secs(30);

/// The quarantine deadline the agent gives `pod`'s address now (it can only move later).
fn deadline(api: &AgentApi, pod: &Pod) -> anyhow::Result<SystemTime> {
    let view = api.wait_state(pod.v4, StateName::Quarantined)?;
    let until = view
        .until
        .as_deref()
        .with_context(|| format!("a quarantined address has a deadline: {view:?}"))?;
    Ok(humantime::parse_rfc3339(until)?)
}

/// Waits until host-local no longer holds `addr` for `pod`, failing if that ever happens while
/// the agent still has `addr` in its registry or before `not_before` (an early release). Each
/// round reads host-local's store first and the registry second, so a release seen gone
/// happened before the registry was asked.
fn wait_for_release(
    lab: &Lab,
    chain: &Chain,
    api: &AgentApi,
    pod: &Pod,
    not_before: SystemTime,
) -> anyhow::Result<()> {
    // `poll` retries a probe's errors, so an early release is carried out as a value.
    let early = poll(
        &format!("the release of {}", pod.v4),
        RELEASE_WITHIN,
        || {
            let held = host_local_allocations(&data_dir(lab), &chain.name)?
                .get(&pod.v4)
                .is_some_and(|id| *id == pod.attachment.container_id);
            // An address the registry freed still has a view while the IPAM holds it.
            let registered = api.get(pod.v4)?.filter(|v| v.state != StateName::Free);
            if held {
                return Ok(None);
            }
            if let Some(view) = registered {
                return Ok(Some(Some(format!(
                    "host-local's DEL ran while the agent still had {}: {view:?}",
                    pod.v4
                ))));
            }
            if SystemTime::now() < not_before {
                return Ok(Some(Some(format!(
                    "host-local's DEL of {} ran before its quarantine deadline {}",
                    pod.v4,
                    humantime::format_rfc3339_millis(not_before)
                ))));
            }
            Ok(Some(None))
        },
    )?;
    match early {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

/// After the fill: A's address is still quarantined (so the exhaustion above was the hold's).
fn fill_the_range(chain: &Chain, api: &AgentApi, a: &Pod) -> anyhow::Result<Vec<Pod>> {
    let others = exhaust_the_range(chain, a)?;
    let view = api
        .get(a.v4)?
        .with_context(|| format!("{} must still be in the registry", a.v4))?;
    ensure!(
        view.state == StateName::Quarantined,
        "A's {} must still be quarantined while the range is full: {view:?}",
        a.v4
    );
    Ok(others)
}

/// Once every held release is done, the agent counted two: A's, and F's (the runtime undid
/// F's failed ADD with a DEL; its release names no address, so it waits `max_cooldown`).
fn assert_released_once(
    lab: &Lab,
    chain: &Chain,
    agent: &ipq_tests::lab::Agent,
) -> anyhow::Result<()> {
    poll("no held release left", RELEASE_WITHIN, || {
        Ok(held_releases(lab)?.is_empty().then_some(()))
    })?;
    let released = agent.metric(
        "ipq_ipam_releases_total",
        &[("network", chain.name.as_str()), ("outcome", "released")],
    )?;
    ensure!(
        released == 2.0,
        "A's and F's releases, each once: {released}"
    );
    Ok(())
}

/// The address comes back: the next pod gets it, and the held release is gone.
fn handed_out_again(lab: &Lab, chain: &Chain, a: &Pod) -> anyhow::Result<()> {
    let again = add(chain, "ig")?;
    ensure!(
        again.v4 == a.v4,
        "the only free address after the release is A's {}, got {}",
        a.v4,
        again.v4
    );
    let releases = held_releases(lab)?;
    ensure!(releases.is_empty(), "no release left: {releases:?}");
    Ok(())
}

/// `with_prev_result`: whether the DEL carries the ADD's result (libcni sends it from its
/// cache; without the cache, the agent names the addresses from its own record).
fn released_after_the_quarantine(
    lab: &Lab,
    chain: &Chain,
    with_prev_result: bool,
) -> anyhow::Result<()> {
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(lab)?;
    let a = add(chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, with_prev_result.then_some(&a.result))?;
    let releases = held_releases(lab)?;
    ensure!(
        releases.len() == 1 && releases[0].addresses == vec![a.v4],
        "the agent stored the release of A's {}: {releases:?}",
        a.v4
    );
    let not_before = deadline(&api, &a)?;
    // `ipq get` says the IPAM holds it, for whom, and that it goes after the quarantine.
    // (The releaser's next scan of the stored releases shows it.)
    let hold = poll("ipq get showing the IPAM's hold", RELEASE_WITHIN, || {
        Ok(api.get(a.v4)?.and_then(|v| v.ipam_hold))
    })?;
    ensure!(
        hold.network == chain.name
            && hold.container_id == a.attachment.container_id
            && hold.release == ipq_api::HoldRelease::AfterQuarantine,
        "{hold:?}"
    );
    let network = [("network", chain.name.as_str())];
    poll("ipq_ipam_held_addresses 1", RELEASE_WITHIN, || {
        Ok((_agent.metric("ipq_ipam_held_addresses", &network)? == 1.0).then_some(()))
    })?;
    let _others = fill_the_range(chain, &api, &a)?;
    wait_for_release(lab, chain, &api, &a, not_before)?;
    assert_released_once(lab, chain, &_agent)?;
    poll("ipq_ipam_held_addresses 0", RELEASE_WITHIN, || {
        Ok((_agent.metric("ipq_ipam_held_addresses", &network)? == 0.0).then_some(()))
    })?;
    ensure!(
        api.get(a.v4)?.is_none(),
        "released: neither the registry nor the IPAM holds {}",
        a.v4
    );
    handed_out_again(lab, chain, &a)
}

#[test]
fn bridge_the_agent_releases_host_locals_allocation_after_the_quarantine() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    released_after_the_quarantine(&lab, &chain, true)
}

#[test]
fn ptp_without_prev_result_the_agent_releases_host_locals_allocation_after_the_quarantine(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = ptp_chain(&lab, "0.4.0")?;
    released_after_the_quarantine(&lab, &chain, false)
}

#[test]
fn a_sigkilled_agent_releases_once_after_the_original_deadline() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    chain.del(&a.attachment, Some(&a.result))?;
    let not_before = deadline(&api, &a)?;
    agent.kill9();
    ensure!(
        host_local_allocations(&data_dir(&lab), &chain.name)?.contains_key(&a.v4),
        "nothing released by the time of the SIGKILL"
    );
    let agent = lab.start_agent(&QUARANTINE)?;
    let _others = fill_the_range(&chain, &api, &a)?;
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    assert_released_once(&lab, &chain, &agent)?;
    handed_out_again(&lab, &chain, &a)
}

/// What a node that lost all of ipq's state but the held releases has (a journal on a wiped
/// disk, pins gone with a reboot): the registry knows nothing of A's quarantine. The release
/// then waits `max_cooldown` (6 s) from its hand-over, which no quarantine outlasts.
#[test]
fn a_lost_journal_and_lost_pins_release_no_earlier_than_max_cooldown_after_the_del(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    let handed_over = SystemTime::now();
    chain.del(&a.attachment, Some(&a.result))?;
    let deadline = deadline(&api, &a)?;
    agent.kill9();
    std::fs::remove_file(state_dir(&lab).join("registry.journal"))
        .context("removing the journal")?;
    for dir in ["links", "maps", "progs"] {
        for entry in std::fs::read_dir(lab.bpffs.path().join(dir))? {
            std::fs::remove_file(entry?.path())?;
        }
    }
    let agent = lab.start_agent(&QUARANTINE)?;
    ensure!(
        api.get(a.v4)?.is_none_or(|v| v.state == StateName::Free),
        "the registry must have forgotten A's {} for this test to mean anything",
        a.v4
    );
    let not_before = deadline.max(handed_over + Duration::from_secs(6));
    let _others = exhaust_the_range(&chain, &a)?;
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    assert_released_once(&lab, &chain, &agent)?;
    handed_out_again(&lab, &chain, &a)
}

/// Issue 36 (5): a simulated reboot (the stored release names another boot) across which the
/// wall clock stepped two hours ahead (its wall-clock stamp two hours old), on a node that
/// lost its journal and pins. Measured before: the release ran at once. Its boottime stamp is
/// another boot's clock and the wall clock cannot be trusted: the whole `max_cooldown` counts
/// from the restart.
#[test]
fn across_a_simulated_reboot_a_wall_clock_step_releases_nothing_early() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    deadline(&api, &a)?;
    agent.kill9();
    let dir = paths::ipam_release_dir(&state_dir(&lab));
    let mut rewritten = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let mut release: Value = serde_json::from_slice(&std::fs::read(&path)?)?;
        ensure!(
            release["heldAtBoot"]["bootId"].is_string(),
            "the agent stamps the release with its boot: {release}"
        );
        release["heldAtBoot"]["bootId"] = json!("a-boot-before-the-reboot");
        let two_hours_ago = release["heldAtUnixMs"].as_u64().context("heldAtUnixMs")? - 7_200_000;
        release["heldAtUnixMs"] = json!(two_hours_ago);
        std::fs::write(&path, release.to_string())?;
        rewritten += 1;
    }
    ensure!(rewritten == 1, "one stored release, not {rewritten}");
    std::fs::remove_file(state_dir(&lab).join("registry.journal"))
        .context("removing the journal")?;
    for dir in ["links", "maps", "progs"] {
        for entry in std::fs::read_dir(lab.bpffs.path().join(dir))? {
            std::fs::remove_file(entry?.path())?;
        }
    }
    let restarted = SystemTime::now();
    let agent = lab.start_agent(&QUARANTINE)?;
    ensure!(
        api.get(a.v4)?.is_none_or(|v| v.state == StateName::Free),
        "the registry must have forgotten A's {} for this test to mean anything",
        a.v4
    );
    let not_before = restarted + Duration::from_secs(6);
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    poll("no held release left", RELEASE_WITHIN, || {
        Ok(held_releases(&lab)?.is_empty().then_some(()))
    })?;
    let released = agent.metric(
        "ipq_ipam_releases_total",
        &[("network", chain.name.as_str()), ("outcome", "released")],
    )?;
    ensure!(released == 1.0, "A's release, once: {released}");
    Ok(())
}

#[test]
fn a_del_while_the_agent_is_away_is_released_after_the_quarantine() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    agent.terminate()?;
    // ipq-cni spools its DEL, ipq-ipam holds the release: both succeed with the agent away.
    chain.del(&a.attachment, Some(&a.result))?;
    ensure!(
        held_releases(&lab)?.len() == 1,
        "the release is held while the agent is away"
    );
    drop(agent);
    let agent = lab.start_agent(&QUARANTINE)?;
    let not_before = deadline(&api, &a)?;
    let _others = fill_the_range(&chain, &api, &a)?;
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    assert_released_once(&lab, &chain, &agent)?;
    handed_out_again(&lab, &chain, &a)
}

#[test]
fn a_requested_address_ipq_holds_is_try_again_later_until_its_release() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let not_before = deadline(&api, &a)?;

    let ns = NetNs::new("is")?;
    let static_pod = Attachment::new(format!("is{}", ns.name().replace('-', "")), &ns)
        .with_args(format!("IgnoreUnknown=1;IP={}", a.v4));
    let names_the_hold = |err: &ipq_tests::cni::PluginError| {
        err.code == Some(11)
            && err.msg.contains(&a.v4.to_string())
            && err.msg.contains(&a.attachment.container_id)
            && err.msg.contains("until")
    };
    match chain.add(&static_pod) {
        Ok(result) => anyhow::bail!("CNI_ARGS IP={} must be refused: {result}", a.v4),
        Err(err) => ensure!(names_the_hold(&err), "code 11 naming the hold: {err}"),
    }
    // The same through the `ips` capability.
    let by_capability = Attachment::new(format!("ic{}", ns.name().replace('-', "")), &ns);
    chain.plugins[0]["runtimeConfig"] = json!({"ips": [format!("{}/29", a.v4)]});
    match chain.add(&by_capability) {
        Ok(result) => anyhow::bail!("runtimeConfig.ips {} must be refused: {result}", a.v4),
        Err(err) => ensure!(names_the_hold(&err), "code 11 naming the hold: {err}"),
    }
    if let Some(conf) = chain.plugins[0].as_object_mut() {
        conf.remove("runtimeConfig");
    }

    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    let result = chain.add(&static_pod)?;
    let got = addresses(&result)?;
    ensure!(
        got == vec![a.v4],
        "after the release the static pod gets {}: {result}",
        a.v4
    );
    Ok(())
}

/// B drains (ipq-cni's DEL) and its IPAM allocation is handed to ipq-ipam's DEL, while its
/// veth, and so B itself, stays: an allocator freeing a terminating task's address early.
fn drain_with_early_ipam_del(chain: &Chain, b: &Pod) -> anyhow::Result<()> {
    chain.exec(1, "DEL", &b.attachment, Some(&b.result))?;
    let conf = chain.plugin_config(0, Some(&b.result));
    chain.exec_plugin("ipq-ipam", "DEL", Some(&b.attachment), &conf)?;
    Ok(())
}

/// Drops host-local's allocation of `addr` and points its round-robin just before it, as a
/// hold lost by hand would leave things: host-local's next pick is `addr`.
fn lose_the_hold(lab: &Lab, chain: &Chain, addr: IpAddr, before: IpAddr) -> anyhow::Result<()> {
    let dir = data_dir(lab).join(&chain.name);
    std::fs::remove_file(dir.join(addr.to_string()))?;
    std::fs::write(dir.join("last_reserved_ip.0"), before.to_string())?;
    Ok(())
}

#[test]
fn a_held_address_the_delegate_hands_out_is_parked_and_the_delegate_asked_again(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let not_before = deadline(&api, &a)?;
    lose_the_hold(&lab, &chain, a.v4, "10.93.0.1".parse()?)?;

    let b = add(&chain, "ib")?;
    ensure!(b.v4 != a.v4, "B must not get A's quarantined {}", a.v4);
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    let parked = allocations
        .get(&a.v4)
        .with_context(|| format!("{} parked in host-local: {allocations:?}", a.v4))?;
    ensure!(
        parked.starts_with(&format!("{}-ipqheld-", b.attachment.container_id)),
        "{} is parked under B's parking id: {parked}",
        a.v4
    );
    let releases = held_releases(&lab)?;
    ensure!(
        releases
            .iter()
            .any(|r| r.container_id == *parked && r.addresses == vec![a.v4]),
        "the parking allocation's release is held: {releases:?}"
    );
    let parked_pod = Pod {
        _ns: NetNs::new("ip")?,
        attachment: Attachment {
            container_id: parked.clone(),
            ..a.attachment.clone()
        },
        result: a.result.clone(),
        v4: a.v4,
    };
    wait_for_release(&lab, &chain, &api, &parked_pod, not_before)?;
    Ok(())
}

#[test]
fn after_bounded_tries_of_held_addresses_the_add_is_try_again_later() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let mut held = Vec::new();
    for role in ["ia", "ib", "ic"] {
        let pod = add(&chain, role)?;
        api.wait_state(pod.v4, StateName::Active)?;
        held.push(pod);
    }
    for pod in &held {
        chain.del(&pod.attachment, Some(&pod.result))?;
        api.wait_state(pod.v4, StateName::Quarantined)?;
    }
    // All three holds lost: host-local hands out .2, .3, .4 in turn.
    for pod in &held {
        lose_the_hold(&lab, &chain, pod.v4, "10.93.0.1".parse()?)?;
    }
    let err = match add(&chain, "id") {
        Ok(pod) => anyhow::bail!("D must not get an address, got {}", pod.v4),
        Err(e) => e,
    };
    let text = format!("{err:#}");
    let last = &held[2];
    ensure!(
        text.contains("code Some(11)")
            && text.contains(&last.v4.to_string())
            && text.contains(&last.attachment.container_id)
            && text.contains("until"),
        "error 11 naming the last held address, its holder and until: {text}"
    );
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    for pod in &held {
        ensure!(
            allocations
                .get(&pod.v4)
                .is_some_and(|id| id.contains("-ipqheld-")),
            "{} stays parked: {allocations:?}",
            pod.v4
        );
    }
    Ok(())
}

/// A second delegate that is not host-local: Debian's `static`, which knows nothing of holds
/// and hands every pod the same configured address. The deleted pod's address stays held:
/// the next pod's ADD is error 11 naming it, its holder and until when (ipq-ipam asked the
/// delegate again, boundedly, and got the same address each time), and once the quarantine is
/// over the agent runs static's DEL and the next pod gets it.
#[test]
fn static_as_the_delegate_gets_the_same_holds() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let static_ipam = json!({
        "type": "static",
        "addresses": [{"address": "10.95.0.5/24", "gateway": "10.95.0.1"}],
    });
    let ptp = json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": ipq_ipam(static_ipam, &lab.work_dir().join("ipq.sock"), &state_dir(&lab)),
    });
    let name = format!("ipam-static-{}", std::process::id());
    let chain = Chain::new(&lab.node, name, "1.0.0", vec![ptp, ipq_cni(&lab)])?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    ensure!(
        a.v4.to_string() == "10.95.0.5",
        "static's address: {}",
        a.v4
    );
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let not_before = deadline(&api, &a)?;

    let err = match add(&chain, "ib") {
        Ok(pod) => anyhow::bail!("B must not get A's held {} yet", pod.v4),
        Err(e) => e,
    };
    let text = format!("{err:#}");
    ensure!(
        text.contains("code Some(11)")
            && text.contains("10.95.0.5")
            && text.contains(&a.attachment.container_id)
            && text.contains("until"),
        "error 11 naming the held address, its holder and until: {text}"
    );
    ensure!(
        SystemTime::now() < not_before,
        "the refusal must come during the quarantine (it ended at {})",
        humantime::format_rfc3339_millis(not_before)
    );
    // After the quarantine and the release, the next pod gets it.
    let b = poll("B's ADD after A's release", RELEASE_WITHIN, || {
        Ok(add(&chain, "ib").ok())
    })?;
    ensure!(
        SystemTime::now() >= not_before && b.v4.to_string() == "10.95.0.5",
        "B got {} at {}",
        b.v4,
        humantime::format_rfc3339_millis(SystemTime::now())
    );
    Ok(())
}
