//! The delegate DEL the agent runs as root: only from the CNI bin directories it trusts
//! (`ipam_cni_bin_dirs`).

use std::path::Path;

use anyhow::ensure;
use ipq::{api::client::ClientError, cni::ipam::release::HeldRelease, registry::StateName};
use ipq_tests::{
    cni::{host_local_allocations, ipq_ipam, AgentApi, Chain},
    lab::Lab,
};
use serde_json::json;

use super::{add, data_dir, held_releases, ipq_cni, state_dir, QUARANTINE};

/// A bridge chain whose IPAM is ipq-ipam wrapping `delegate` (host-local's config) in the
/// /29 `subnet`.
fn chain_with<'l>(lab: &'l Lab, delegate: &str, subnet: &str) -> anyhow::Result<Chain<'l>> {
    let ipam = ipq_ipam(
        json!({
            "type": delegate,
            "dataDir": data_dir(lab),
            "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        }),
        &lab.work_dir().join("ipq.sock"),
        &state_dir(lab),
    );
    let bridge = json!({
        "type": "bridge",
        "bridge": "cnidel0",
        "isGateway": true,
        "ipMasq": false,
        "ipam": ipam,
    });
    let name = format!("ipam-del-{}", std::process::id());
    Chain::new(&lab.node, name, "1.0.0", vec![bridge, ipq_cni(lab)])
}

/// A CNI_PATH the runtime may use but the agent was not told to trust: ADD works (the runtime
/// runs what it likes), but the agent refuses to hold a release whose DEL it would run from
/// there, so ipq-ipam's DEL fails naming why, nothing is spooled and host-local keeps the
/// allocation (neither lost nor released early). A release naming a path as its delegate is
/// refused too.
#[test]
fn a_release_whose_delegate_is_outside_the_trusted_dirs_is_refused() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let untrusted = lab.work_dir().join("untrusted-bin");
    std::fs::create_dir(&untrusted)?;
    for plugin in ["bridge", "host-local"] {
        std::os::unix::fs::symlink(
            Path::new(ipq_tests::cni::DEBIAN_PLUGIN_DIR).join(plugin),
            untrusted.join(plugin),
        )?;
    }
    let mut chain = chain_with(&lab, "host-local", "10.95.0.0/29")?;
    chain.path[0] = untrusted.clone();
    let a = add(&chain, "iu")?;
    api.wait_state(a.v4, StateName::Active)?;
    let err = match chain.del(&a.attachment, Some(&a.result)) {
        Ok(()) => anyhow::bail!("DEL with CNI_PATH {} must fail", untrusted.display()),
        Err(err) => err,
    };
    ensure!(
        err.msg.contains("cniPath") && err.msg.contains("ipam_cni_bin_dirs"),
        "the DEL names the untrusted cniPath and the key to set: {err}"
    );
    let releases = held_releases(&lab)?;
    ensure!(releases.is_empty(), "nothing held or spooled: {releases:?}");
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "host-local still allocates {} to A: {allocations:?}",
        a.v4
    );

    // Straight to the API: a 400 naming the field, for a foreign directory and for a path.
    let release = HeldRelease {
        network: Some(chain.name.clone()),
        cni_version: "1.0.0".into(),
        delegate_type: "host-local".into(),
        delegate_conf: chain.plugin_config(0, None),
        container_id: "forged".into(),
        ifname: "eth0".into(),
        cni_args: None,
        cni_path: "/tmp".into(),
        netns: None,
        addresses: Vec::new(),
        held_at_unix_ms: 0,
    };
    let path_as_type = HeldRelease {
        delegate_type: "../../../bin/sh".into(),
        cni_path: ipq_tests::cni::DEBIAN_PLUGIN_DIR.into(),
        ..release.clone()
    };
    for (release, field) in [(release, "cniPath"), (path_as_type, "delegateType")] {
        match api.runtime.block_on(api.client.hold_release(&release)) {
            Err(ClientError::Api { status, error }) => ensure!(
                status == 400 && error.message.contains(field),
                "400 naming {field}: {status} {}",
                error.message
            ),
            other => anyhow::bail!("a release with {field} {release:?} must be refused: {other:?}"),
        }
    }
    ensure!(held_releases(&lab)?.is_empty(), "nothing stored");
    Ok(())
}
