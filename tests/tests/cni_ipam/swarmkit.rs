//! The SwarmKit replay (moby/swarmkit#2407) on the CNI path, with and without ipq-ipam: task A
//! is terminating (ipq-cni's DEL drained it, its veth and its traffic still live) when the
//! allocator frees its address early (the IPAM's DEL runs before A is gone), and host-local's
//! round-robin has wrapped, so its next pick is A's address (`last_reserved_ip` set just before
//! it, as a full cycle of the range leaves it). Then task B is added.
//!
//! - Without ipq-ipam, host-local frees A's address and hands it to B. B works; A, still
//!   terminating, is fenced (fence-old) and its graceful termination cut off: its pings fail.
//! - With ipq-ipam, the early DEL is held: host-local still has A's address allocated, so B
//!   gets another address at once, and A's pings keep flowing to the end of its termination.
//!   B asking for A's address by name is error 11 naming A.

use std::net::IpAddr;

use anyhow::{ensure, Context as _};
use ipq::registry::StateName;
use ipq_tests::{
    cni::{AgentApi, Chain},
    lab::ping,
};
use serde_json::json;

use super::{add, drain_with_early_ipam_del, ipq_cni, Lab, Pod, QUARANTINE};

/// host-local's next pick is the address after `before` (A's): a range that went round once.
fn wrap_round_robin(lab: &Lab, chain: &Chain, before: IpAddr) -> anyhow::Result<()> {
    let file = super::data_dir(lab)
        .join(&chain.name)
        .join("last_reserved_ip.0");
    std::fs::write(&file, before.to_string()).with_context(|| format!("{}", file.display()))
}

/// A's pings to the bridge (its gateway) that come back, of 5.
fn a_reaches_its_gateway(a: &Pod, gateway: IpAddr) -> u32 {
    ping(&a._ns, gateway, 5)
}

#[test]
fn swarmkit_replay_without_ipq_ipam_the_new_task_takes_the_address_and_the_old_is_fenced(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let host_local = json!({
        "type": "host-local",
        "dataDir": super::data_dir(&lab),
        "ranges": [[{"subnet": "10.97.0.0/29"}]],
    });
    let bridge = json!({
        "type": "bridge", "bridge": "cniswarm0", "isGateway": true, "ipMasq": false,
        "ipam": host_local,
    });
    let name = format!("swarm-plain-{}", std::process::id());
    let chain = Chain::new(&lab.node, name, "1.0.0", vec![bridge, ipq_cni(&lab)])?;
    let gateway: IpAddr = "10.97.0.1".parse()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "sa")?;
    api.wait_state(a.v4, StateName::Active)?;
    ensure!(a_reaches_its_gateway(&a, gateway) == 5, "A works before");

    // A terminates; the allocator frees its address at once.
    chain.exec(1, "DEL", &a.attachment, Some(&a.result))?;
    api.wait_state(a.v4, StateName::Draining)?;
    let conf = chain.plugin_config(0, Some(&a.result));
    chain.exec_plugin("host-local", "DEL", Some(&a.attachment), &conf)?;
    wrap_round_robin(&lab, &chain, gateway)?;

    let b = add(&chain, "sb")?;
    ensure!(
        b.v4 == a.v4,
        "host-local hands A's freed {} to B, got {}",
        a.v4,
        b.v4
    );
    ensure!(ping(&b._ns, gateway, 5) == 5, "B works");
    ensure!(
        a_reaches_its_gateway(&a, gateway) == 0,
        "A, still terminating, is cut off (fenced) for the address B now has"
    );
    Ok(())
}

#[test]
fn swarmkit_replay_with_ipq_ipam_the_new_task_gets_another_address_and_the_old_finishes(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = super::bridge_chain(&lab, "1.0.0")?;
    let gateway: IpAddr = "10.93.0.1".parse()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "sa")?;
    api.wait_state(a.v4, StateName::Active)?;
    ensure!(a_reaches_its_gateway(&a, gateway) == 5, "A works before");

    drain_with_early_ipam_del(&chain, &a)?;
    api.wait_state(a.v4, StateName::Draining)?;
    // The same wrapped round-robin; host-local's allocation of A's address is still there.
    wrap_round_robin(&lab, &chain, gateway)?;

    let b = add(&chain, "sb").context("B gets an address at once")?;
    ensure!(b.v4 != a.v4, "B must not get A's {}", a.v4);
    ensure!(ping(&b._ns, gateway, 5) == 5, "B works");
    ensure!(
        a_reaches_its_gateway(&a, gateway) == 5,
        "A finishes its termination undisturbed"
    );
    let view = api.get(a.v4)?.context("A's address is still A's")?;
    ensure!(
        view.state == StateName::Draining && view.fenced.is_none(),
        "A drains, unfenced: {view:?}"
    );

    // B' asking for A's address by name: try again later, naming A.
    let ns = ipq_tests::netns::NetNs::new("sc")?;
    let asking = ipq_tests::cni::Attachment::new(format!("sc{}", ns.name().replace('-', "")), &ns)
        .with_args(format!("IgnoreUnknown=1;IP={}", a.v4));
    match chain.add(&asking) {
        Ok(result) => anyhow::bail!("A's {} must not be handed out: {result}", a.v4),
        Err(err) => ensure!(
            err.code == Some(11) && err.msg.contains(&a.attachment.container_id),
            "error 11 naming A: {err}"
        ),
    }
    Ok(())
}
