//! GC and STATUS (spec 1.1.0) through ipq-ipam, run as a main plugin runs its IPAM plugin.
//!
//! Debian's host-local (1.1.1) speaks up to 1.0.0 and has no GC, so ipq-ipam sends it none and
//! its allocations all stay. The pass-through itself is shown with a delegate that has GC and
//! STATUS and records what it is sent (a shell plugin of the test's own: no plugin on this
//! machine has GC): the runtime's valid attachments plus every one whose release ipq holds, also
//! with the agent away. STATUS is the agent's readiness and then the delegate's own answer.

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use anyhow::{ensure, Context as _};
use ipq_tests::cni::{host_local_allocations, ipq_ipam, Chain};
use serde_json::{json, Value};

use super::{add, bridge_chain, data_dir, state_dir, Lab, QUARANTINE};

/// A delegate with GC and STATUS: GC's stdin is written to `record`; STATUS fails with code 50
/// while `down` exists.
fn recording_delegate(dir: &Path, record: &Path, down: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("gc-recorder");
    std::fs::write(
        &path,
        format!(
            r#"#!/bin/sh
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}' ;;
GC) cat > '{record}' ;;
STATUS) if [ -e '{down}' ]; then echo '{{"cniVersion":"1.1.0","code":50,"msg":"pool offline"}}'; exit 1; fi ;;
*) echo '{{"cniVersion":"1.1.0","code":4,"msg":"only GC and STATUS"}}'; exit 1 ;;
esac
"#,
            record = record.display(),
            down = down.display()
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The bridge plugin's whole config, as it would hand it to its IPAM plugin for `command`.
fn main_conf(chain: &Chain, ipam: Value, valid: Value) -> Value {
    let mut conf = chain.plugin_config(0, None);
    conf["cniVersion"] = json!("1.1.0");
    conf["ipam"] = ipam;
    conf["cni.dev/valid-attachments"] = valid;
    conf
}

fn attachments(record: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let sent: Value =
        serde_json::from_str(&std::fs::read_to_string(record).context("the delegate got no GC")?)?;
    let mut out: Vec<(String, String)> = sent["cni.dev/valid-attachments"]
        .as_array()
        .with_context(|| format!("valid attachments in {sent}"))?
        .iter()
        .map(|a| {
            (
                a["containerID"].as_str().unwrap_or_default().to_owned(),
                a["ifname"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

#[test]
fn a_gc_never_frees_a_held_address_and_status_says_whether_an_add_would_work() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    let mut chain = bridge_chain(&lab, "1.0.0")?;
    let plugins = lab.work_dir().join("plugins");
    let record = lab.work_dir().join("gc-stdin.json");
    let down = lab.work_dir().join("pool-down");
    recording_delegate(&plugins, &record, &down)?;
    chain.path.push(plugins);
    let mut agent = lab.start_agent(&QUARANTINE)?;
    let a = add(&chain, "ga")?;
    let b = add(&chain, "gb")?;
    chain.del(&a.attachment, Some(&a.result))?;
    let live = json!([{"containerID": b.attachment.container_id, "ifname": b.attachment.ifname}]);

    // host-local has no GC: it is sent none, and A's held allocation stays.
    let host_local = chain.plugins[0]["ipam"].clone();
    chain
        .exec_plugin(
            "ipq-ipam",
            "GC",
            None,
            &main_conf(&chain, host_local.clone(), live.clone()),
        )
        .map_err(|e| anyhow::anyhow!("GC with host-local: {e:#}"))?;
    let held = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        held.get(&a.v4) == Some(&a.attachment.container_id),
        "A's allocation must survive the GC: {held:?}"
    );
    chain
        .exec_plugin(
            "ipq-ipam",
            "STATUS",
            None,
            &main_conf(&chain, host_local.clone(), json!([])),
        )
        .map_err(|e| anyhow::anyhow!("STATUS with a ready agent: {e:#}"))?;

    // A delegate with GC gets the runtime's list plus A, the attachment ipq holds.
    let recorder = ipq_ipam(
        json!({"type": "gc-recorder"}),
        &lab.work_dir().join("ipq.sock"),
        &state_dir(&lab),
    );
    let mut expected = vec![
        (
            a.attachment.container_id.clone(),
            a.attachment.ifname.clone(),
        ),
        (
            b.attachment.container_id.clone(),
            b.attachment.ifname.clone(),
        ),
    ];
    expected.sort();
    chain
        .exec_plugin(
            "ipq-ipam",
            "GC",
            None,
            &main_conf(&chain, recorder.clone(), live.clone()),
        )
        .map_err(|e| anyhow::anyhow!("GC with a GC delegate: {e:#}"))?;
    ensure!(
        attachments(&record)? == expected,
        "sent {:?}",
        attachments(&record)?
    );

    // The delegate's STATUS is passed on, under its name.
    std::fs::write(&down, "")?;
    let err = chain
        .exec_plugin(
            "ipq-ipam",
            "STATUS",
            None,
            &main_conf(&chain, recorder.clone(), json!([])),
        )
        .err()
        .context("STATUS must pass on the delegate's failure")?;
    ensure!(
        err.code == Some(50) && err.msg.contains("gc-recorder") && err.msg.contains("pool offline"),
        "{err:#}"
    );
    std::fs::remove_file(&down)?;

    // The agent away: STATUS is "not available", and a GC still keeps A (read from stateDir).
    agent.kill9();
    let err = chain
        .exec_plugin(
            "ipq-ipam",
            "STATUS",
            None,
            &main_conf(&chain, host_local, json!([])),
        )
        .err()
        .context("STATUS must fail with the agent away")?;
    ensure!(
        err.code == Some(50) && err.msg.contains("ipq.sock"),
        "STATUS names the agent's socket: {err:#}"
    );
    std::fs::remove_file(&record)?;
    chain
        .exec_plugin("ipq-ipam", "GC", None, &main_conf(&chain, recorder, live))
        .map_err(|e| anyhow::anyhow!("GC with the agent away: {e:#}"))?;
    ensure!(
        attachments(&record)? == expected,
        "with the agent away, sent {:?}",
        attachments(&record)?
    );
    Ok(())
}
