//! The delegate DEL the agent runs as root: only from the CNI bin directories it trusts
//! (`ipam_cni_bin_dirs`), and, when it fails, retried, counted and shown until it succeeds,
//! the allocation held meanwhile.

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use anyhow::ensure;
use ipq::{api::client::ClientError, registry::StateName};
use ipq_cni::ipam::release::HeldRelease;
use ipq_tests::{
    cni::{addresses, host_local_allocations, ipq_ipam, AgentApi, Attachment, Chain},
    lab::{poll, Lab},
    netns::NetNs,
};
use serde_json::json;

use super::{add, data_dir, deadline, held_releases, ipq_cni, state_dir, QUARANTINE};

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

fn executable(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// A CNI_PATH the runtime may use but the agent was not told to trust: the agent refuses to
/// record an allocation whose DEL it would run from there, so ipq-ipam's ADD fails naming why
/// (the operator sees the misconfiguration at the first pod, not at its deletion), and the
/// runtime's DEL of that failed ADD is refused alike: nothing is recorded, held or spooled.
/// A release naming a path as its delegate is refused too.
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
    let names_the_key = |err: &ipq_tests::cni::PluginError| {
        err.msg.contains("cniPath") && err.msg.contains("ipam_cni_bin_dirs")
    };
    let ns = NetNs::new("iu")?;
    let attachment = Attachment::new(format!("iu{}", ns.name().replace('-', "")), &ns);
    match chain.add(&attachment) {
        Ok(result) => anyhow::bail!(
            "ADD with CNI_PATH {} must fail: {result}",
            untrusted.display()
        ),
        Err(err) => ensure!(
            names_the_key(&err),
            "the ADD names the untrusted cniPath and the key to set: {err}"
        ),
    }
    match chain.del(&attachment, None) {
        Ok(()) => anyhow::bail!("DEL with CNI_PATH {} must fail", untrusted.display()),
        Err(err) => ensure!(
            names_the_key(&err),
            "the DEL names the untrusted cniPath and the key to set: {err}"
        ),
    }
    let releases = held_releases(&lab)?;
    ensure!(releases.is_empty(), "nothing held or spooled: {releases:?}");
    let records = ipq_fs::paths::ipam_allocation_dir(&state_dir(&lab));
    ensure!(
        std::fs::read_dir(&records).map_or(true, |mut d| d.next().is_none()),
        "nothing recorded in {}",
        records.display()
    );

    // Straight to the API: a 400 naming the field, for a foreign directory and for a path.
    // The network config with `ipam` replaced by the delegate's, as ipq-ipam hands it over.
    let mut delegate_conf = chain.plugin_config(0, None);
    delegate_conf["ipam"] = delegate_conf["ipam"]["delegate"].clone();
    let release = HeldRelease {
        network: Some(chain.name.clone()),
        cni_version: "1.0.0".into(),
        delegate_type: "host-local".into(),
        delegate_conf,
        container_id: "forged".into(),
        ifname: "eth0".into(),
        cni_args: None,
        cni_path: "/tmp".into(),
        netns: None,
        addresses: Vec::new(),
        held_at_unix_ms: 0,
        held_at_boot: None,
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

/// A delegate whose DEL fails (host-local behind a script that refuses DEL while a marker
/// exists): once A's quarantine is over the agent's DEL fails, is counted
/// (`ipq_ipam_releases_total{outcome="failed"}`, `ipq_ipam_failing_releases`) and retried,
/// and the allocation stays held: host-local keeps it, `ipq get` says the release is failing,
/// and a pod asking for A's address is refused. With the marker gone the retry releases it and
/// the address is handed out again.
#[test]
fn a_failing_delegate_del_is_retried_and_the_allocation_stays_held() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let bin = lab.cni_bin_dir();
    std::fs::create_dir(&bin)?;
    let marker = lab.work_dir().join("refuse-del");
    std::fs::write(&marker, "")?;
    executable(
        &bin.join("flaky-local"),
        &format!(
            "#!/bin/sh\n\
             # host-local, whose DEL fails while {m} exists\n\
             if [ \"$CNI_COMMAND\" = DEL ] && [ -e '{m}' ]; then\n\
             \x20 echo '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"DEL refused by the test\"}}'\n\
             \x20 exit 1\n\
             fi\n\
             exec {debian}/host-local\n",
            m = marker.display(),
            debian = ipq_tests::cni::DEBIAN_PLUGIN_DIR,
        ),
    )?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let mut chain = chain_with(&lab, "flaky-local", "10.96.0.0/29")?;
    chain.path.insert(1, bin.clone());
    let network = chain.name.clone();
    let failed = [("network", network.as_str()), ("outcome", "failed")];
    let released = [("network", network.as_str()), ("outcome", "released")];

    let a = add(&chain, "if")?;
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    deadline(&api, &a)?;
    poll("the first failed release", super::RELEASE_WITHIN, || {
        let scrape = agent.scrape()?;
        let failing = scrape.get("ipq_ipam_failing_releases", &[])?;
        Ok(
            (scrape.count("ipq_ipam_releases_total", &failed) >= 1.0 && failing == 1.0)
                .then_some(()),
        )
    })?;
    let count = agent.scrape()?.count("ipq_ipam_releases_total", &released);
    ensure!(
        count == 0.0,
        "nothing released while the DEL fails: {count}"
    );
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "host-local still allocates {} to A: {allocations:?}",
        a.v4
    );
    // The releaser's next scan (after the failure) shows it in the holds `ipq get` reads.
    let hold = poll(
        "ipq get showing the failing release",
        super::RELEASE_WITHIN,
        || {
            Ok(api
                .get(a.v4)?
                .and_then(|v| v.ipam_hold)
                .filter(|hold| hold.release == ipq_api::HoldRelease::Failing))
        },
    )?;
    let error = hold.error.unwrap_or_default();
    ensure!(
        error.contains("DEL refused by the test"),
        "the hold says why its release fails: {error:?}"
    );
    let ns = NetNs::new("is")?;
    let wants_a = Attachment::new(format!("is{}", ns.name().replace('-', "")), &ns)
        .with_args(format!("IgnoreUnknown=1;IP={}", a.v4));
    match chain.add(&wants_a) {
        Ok(result) => anyhow::bail!("{} is held, so IP={} is refused: {result}", a.v4, a.v4),
        Err(err) => ensure!(
            err.code == Some(11) && err.msg.contains(&a.v4.to_string()),
            "code 11 naming the held {}: {err}",
            a.v4
        ),
    }

    std::fs::remove_file(&marker)?;
    // The refused ADD's own DEL left a release without addresses; both go once DELs work.
    poll("every release done", super::RELEASE_WITHIN, || {
        let scrape = agent.scrape()?;
        let done = scrape.count("ipq_ipam_releases_total", &released) >= 1.0
            && scrape.get("ipq_ipam_failing_releases", &[])? == 0.0
            && held_releases(&lab)?.is_empty();
        Ok(done.then_some(()))
    })?;
    ensure!(
        !host_local_allocations(&data_dir(&lab), &chain.name)?.contains_key(&a.v4),
        "host-local freed {}",
        a.v4
    );
    let result = chain.add(&wants_a)?;
    ensure!(
        addresses(&result)? == vec![a.v4],
        "after the release the pod asking for {} gets it: {result}",
        a.v4
    );
    Ok(())
}
