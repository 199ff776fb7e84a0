//! ipq-ipam's records of its allocations (issue 27): what its ADD allocated is what a later
//! release runs. A release naming another delegate than the record's is a 409, one naming
//! another config runs the record's, and a record ipq-ipam wrote while the agent was away is
//! adopted and holds alike.

use anyhow::ensure;
use ipq::registry::StateName;
use ipq_fs::paths;
use ipq_tests::cni::AgentApi;
use ipq_tests::lab::Lab;
use serde_json::json;

use super::{
    add,
    adversary::{post, release_of},
    bridge_chain, data_dir, deadline, held_releases, state_dir, wait_for_release, QUARANTINE,
};

#[test]
fn a_release_runs_its_allocations_record_never_its_body() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let a = add(&chain, "ia")?;
    api.wait_state(a.v4, StateName::Active)?;

    // Another IPAM of the trusted dir, its body consistent: not the allocation's delegate.
    let mut other_ipam = release_of(&chain, &a, "static", &[]);
    other_ipam.delegate_conf["ipam"] = json!({"type": "static"});
    match post(&api, &other_ipam)? {
        Some((409, message)) => ensure!(
            message.contains("delegateType") && message.contains("host-local"),
            "409 naming the delegate and the record's: {message}"
        ),
        other => anyhow::bail!("another delegate than the record's is a 409: {other:?}"),
    }
    ensure!(held_releases(&lab)?.is_empty(), "nothing stored");

    // The right delegate with another config: stored, but as the record has it.
    let mut elsewhere = release_of(&chain, &a, "host-local", &[a.v4]);
    elsewhere.delegate_conf["ipam"]["dataDir"] = json!(lab.work_dir().join("elsewhere"));
    elsewhere.cni_args = Some("IgnoreUnknown=1;IP=10.93.0.5".into());
    ensure!(post(&api, &elsewhere)?.is_none(), "stored");
    let releases = held_releases(&lab)?;
    ensure!(
        releases.len() == 1
            && releases[0].delegate_conf["ipam"]["dataDir"] == json!(data_dir(&lab))
            && releases[0].cni_args.is_none()
            && releases[0].addresses == vec![a.v4],
        "the record's config, args and addresses are what is held: {releases:?}"
    );
    // The pod goes (its DEL repeated, as runtimes do): the release stored first stands.
    chain.del(&a.attachment, Some(&a.result))?;
    chain.del(&a.attachment, None)?;
    let again = held_releases(&lab)?;
    ensure!(
        again == releases,
        "one release, as first stored: {again:?} after {releases:?}"
    );
    // Its address is released after its quarantine, from the real data dir.
    let not_before = deadline(&api, &a)?;
    wait_for_release(&lab, &chain, &api, &a, not_before)
}

#[test]
fn a_record_written_while_the_agent_was_away_is_adopted() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut chain = bridge_chain(&lab, "1.0.0")?;
    // Both plugins attach the pod with the agent away (the default is to fail).
    chain.plugins[0]["ipam"]["onUnavailable"] = json!("allow");
    chain.plugins[1]["onUnavailable"] = json!("allow");
    let mut agent = lab.start_agent(&QUARANTINE)?;
    agent.terminate()?;
    drop(agent);
    let a = add(&chain, "ia")?;
    let dir = paths::ipam_allocation_dir(&state_dir(&lab));
    let files = std::fs::read_dir(&dir)?.count();
    ensure!(
        files == 1,
        "ipq-ipam wrote the record itself: {files} files"
    );
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let mut other_ipam = release_of(&chain, &a, "static", &[]);
    other_ipam.delegate_conf["ipam"] = json!({"type": "static"});
    match post(&api, &other_ipam)? {
        Some((409, message)) => ensure!(
            message.contains("host-local"),
            "409 naming the adopted record's delegate: {message}"
        ),
        other => anyhow::bail!("the adopted record decides: {other:?}"),
    }
    Ok(())
}
