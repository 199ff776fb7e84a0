//! Pool pressure (`ipam_on_exhausted`): host-local's /29 full of live pods and of addresses
//! ipq holds, one quarantined (A, deleted) and one whose holder still drains (B: its ipq-cni
//! DEL ran and the IPAM was asked to free it early, but its veth still lives, as when an
//! orchestrator frees the address of a terminating task).
//!
//! - `wait`: the next ADD is error 11 naming 1 quarantined and 1 draining held address and
//!   when the first is released; nothing is released.
//! - `release-quietest` (after a restart with it): host-local's DEL of A's allocation runs at
//!   once and the next pod gets A's address; B's stays held. With only B's left, the next ADD
//!   is error 11 again: a draining holder's address is never released early.
//!
//! Each is counted by outcome and published as `ipam_exhausted`.

use anyhow::{ensure, Context as _};
use ipq::{api::model::EventBody, registry::StateName};
use ipq_tests::cni::{host_local_allocations, AgentApi, Chain};

use super::{add, bridge_chain, data_dir, drain_with_early_ipam_del, Lab, Pod};

/// A quarantine that lasts the whole test.
const LONG_QUARANTINE: [&str; 8] = [
    "--workload",
    "veth*",
    "--cooldown",
    "120s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "300s",
];

fn exhausted_events(api: &AgentApi) -> anyhow::Result<Vec<EventBody>> {
    let mut out = Vec::new();
    api.runtime.block_on(api.client.events(false, |event| {
        if matches!(event.body, EventBody::IpamExhausted { .. }) {
            out.push(event.body);
        }
        true
    }))?;
    Ok(out)
}

fn try_again_later(chain: &Chain, role: &str) -> anyhow::Result<String> {
    match add(chain, role) {
        Ok(pod) => anyhow::bail!("{role} must not get an address, got {}", pod.v4),
        Err(e) => {
            let text = format!("{e:#}");
            ensure!(text.contains("code Some(11)"), "error 11: {text}");
            Ok(text)
        }
    }
}

#[test]
fn an_exhausted_range_waits_or_releases_the_quietest_quarantined_never_a_draining_holders(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let mut agent = lab.start_agent(&LONG_QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let network = [("network", chain.name.as_str())];
    let pods: Vec<Pod> = ["pa", "pb", "pc", "pd", "pe"]
        .into_iter()
        .map(|role| add(&chain, role))
        .collect::<anyhow::Result<_>>()?;
    let (a, b) = (&pods[0], &pods[1]);
    api.wait_state(b.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    api.wait_state(a.v4, StateName::Quarantined)?;
    drain_with_early_ipam_del(&chain, b)?;
    api.wait_state(b.v4, StateName::Draining)?;
    // The releaser's scan shows both holds before the ADD asks about them.
    ipq_tests::lab::poll("both holds seen", super::RELEASE_WITHIN, || {
        Ok((agent.metric("ipq_ipam_held_addresses", &network)? == 2.0).then_some(()))
    })?;

    let text = try_again_later(&chain, "pf")?;
    ensure!(
        text.contains("no IP addresses available")
            && text.contains("1 quarantined and 1 draining")
            && text.contains("ipam_on_exhausted = wait")
            && text.contains("released at"),
        "{text}"
    );
    ensure!(
        agent.metric(
            "ipq_ipam_exhausted_total",
            &[network[0], ("outcome", "waited")]
        )? == 1.0
    );
    let held = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        held.get(&a.v4) == Some(&a.attachment.container_id),
        "wait releases nothing: {held:?}"
    );

    agent.terminate()?;
    drop(agent);
    let mut quietest = LONG_QUARANTINE.to_vec();
    quietest.extend(["--ipam-on-exhausted", "release-quietest"]);
    let agent = lab.start_agent(&quietest)?;
    ipq_tests::lab::poll("both holds seen again", super::RELEASE_WITHIN, || {
        Ok((agent.metric("ipq_ipam_held_addresses", &network)? == 2.0).then_some(()))
    })?;
    let f = add(&chain, "pf").with_context(|| {
        format!(
            "release-quietest frees A's allocation for F; agent log:\n{}",
            agent.log()
        )
    })?;
    ensure!(f.v4 == a.v4, "F gets A's released {}, got {}", a.v4, f.v4);
    let held = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        held.get(&b.v4) == Some(&b.attachment.container_id),
        "B, still draining, keeps its allocation: {held:?}"
    );
    ensure!(
        agent.metric(
            "ipq_ipam_exhausted_total",
            &[network[0], ("outcome", "released")]
        )? == 1.0
    );

    let text = try_again_later(&chain, "pg")?;
    ensure!(text.contains("0 quarantined and 1 draining"), "{text}");
    ensure!(
        agent.metric(
            "ipq_ipam_exhausted_total",
            &[network[0], ("outcome", "none_releasable")]
        )? == 1.0
    );
    let held = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        held.get(&b.v4) == Some(&b.attachment.container_id),
        "B's allocation is never released while B drains: {held:?}"
    );
    let events = exhausted_events(&api)?;
    let released: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventBody::IpamExhausted { answer, .. } => Some(answer.released.clone()),
            _ => None,
        })
        .collect();
    ensure!(
        released == vec![vec![a.v4], vec![]],
        "published after the restart: A released, then nothing: {events:?}"
    );
    Ok(())
}
