//! Spec 1.1.0 ADD, CHECK and DEL through ipq-ipam, run as a 1.1.0 main plugin runs its IPAM
//! plugin (the test plays that main plugin: ipq-ipam first, then the veth, then `ipq-cni`
//! chained at 1.1.0).
//!
//! Debian's plugins speak at most 1.0.0, so the delegate is a 1.1.0-speaking wrapper of the
//! test's own, `host-local-1.1`: it answers VERSION up to 1.1.0 and otherwise runs Debian's
//! real host-local with the config's `cniVersion` 1.1.0 rewritten to 1.0.0 and its answer's
//! back to 1.1.0. It sits in the lab's own CNI bin dir, which the agent trusts, so the DEL the
//! agent runs after the quarantine is this wrapper's, with the 1.1.0 config ipq-ipam held.

use std::{net::IpAddr, os::unix::fs::PermissionsExt as _, path::Path};

use anyhow::{ensure, Context as _};
use ipq::registry::StateName;
use ipq_tests::{
    cni::{addresses, host_local_allocations, ipq_ipam, AgentApi, Attachment, Chain, PluginError},
    lab::Lab,
    netns::NetNs,
};
use serde_json::{json, Value};

use super::{
    assert_released_once, data_dir, deadline, held_releases, ipq_cni, state_dir, wait_for_release,
    Pod, QUARANTINE, RELEASE_WITHIN,
};

const DELEGATE: &str = "host-local-1.1";
const SUBNET: &str = "10.90.0.0/29";

/// The wrapper in `dir`: host-local made to speak 1.1.0. Every command is logged to `log` and
/// every DEL's stdin kept as `dels/<container id>.json`. dash has no pipefail: host-local's
/// stdout goes through temp files, and its exit status is the wrapper's.
fn host_local_1_1(dir: &Path, log: &Path, dels: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dels)?;
    let path = dir.join(DELEGATE);
    std::fs::write(
        &path,
        format!(
            r#"#!/bin/sh
PATH=/usr/sbin:/usr/bin:/sbin:/bin
echo "$CNI_COMMAND $CNI_CONTAINERID" >> '{log}'
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}}'
  exit 0
fi
in=$(mktemp) || exit 1
out=$(mktemp) || exit 1
cat > "$in"
if [ "$CNI_COMMAND" = DEL ]; then cp "$in" '{dels}'/"$CNI_CONTAINERID.json"; fi
v11='"cniVersion"[[:space:]]*:[[:space:]]*"1\.1\.0"'
v10='"cniVersion"[[:space:]]*:[[:space:]]*"1\.0\.0"'
if grep -q "$v11" "$in"; then
  sed "s/$v11/\"cniVersion\":\"1.0.0\"/g" "$in" | {debian}/host-local > "$out"
  status=$?
  sed "s/$v10/\"cniVersion\": \"1.1.0\"/g" "$out"
else
  {debian}/host-local < "$in" > "$out"
  status=$?
  cat "$out"
fi
rm -f "$in" "$out"
exit $status
"#,
            log = log.display(),
            dels = dels.display(),
            debian = ipq_tests::cni::DEBIAN_PLUGIN_DIR,
        ),
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The lab's own CNI bin dir (trusted by its agents), as the agent's delegate check wants it:
/// root's, writable by nobody else.
fn trusted_bin_dir(lab: &Lab) -> anyhow::Result<std::path::PathBuf> {
    let bin = lab.cni_bin_dir();
    std::fs::create_dir_all(&bin)?;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    ensure!(
        lab.trusted_cni_bin_dirs().contains(&bin),
        "the lab's agents trust {}",
        bin.display()
    );
    Ok(bin)
}

/// A 1.1.0 list: a ptp-like main plugin whose IPAM is ipq-ipam wrapping `host-local-1.1`, and
/// `ipq-cni` chained after it.
fn chain_1_1<'l>(lab: &'l Lab, bin: &Path) -> anyhow::Result<Chain<'l>> {
    let ipam = ipq_ipam(
        json!({
            "type": DELEGATE,
            "dataDir": data_dir(lab),
            "ranges": [[{"subnet": SUBNET}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        }),
        &lab.work_dir().join("ipq.sock"),
        &state_dir(lab),
    );
    let main = json!({"type": "ptp", "ipMasq": false, "ipam": ipam});
    let name = format!("ipam-11-{}", std::process::id());
    let mut chain = Chain::new(&lab.node, name, "1.1.0", vec![main, ipq_cni(lab)])?;
    chain.path.push(bin.to_owned());
    Ok(chain)
}

/// ipq-ipam run for `command` as the main plugin runs its IPAM plugin: the main plugin's whole
/// 1.1.0 config on stdin.
fn ipam(
    chain: &Chain,
    command: &str,
    attachment: &Attachment,
    prev: Option<&Value>,
) -> Result<String, PluginError> {
    let conf = chain.plugin_config(0, prev);
    chain.exec_plugin("ipq-ipam", command, Some(attachment), &conf)
}

fn json_of(stdout: &str) -> anyhow::Result<Value> {
    serde_json::from_str(stdout).with_context(|| format!("a JSON result: {stdout:?}"))
}

/// The main plugin's ADD: the IPAM result, then a veth (host side `host`, `eth0` in the pod),
/// its result (the IPAM's with the interfaces) handed to `ipq-cni`, whose output is the
/// runtime's result.
fn add_1_1(lab: &Lab, chain: &Chain, role: &str, host: &str) -> anyhow::Result<Pod> {
    let ns = NetNs::new(role)?;
    let attachment = Attachment::new(format!("{role}{}", ns.name().replace('-', "")), &ns);
    let ipam_result = json_of(&ipam(chain, "ADD", &attachment, None)?)?;
    ensure!(
        ipam_result["cniVersion"] == "1.1.0",
        "ipq-ipam answers a 1.1.0 ADD with a 1.1.0 result: {ipam_result}"
    );
    lab.node.ip(&[
        "link",
        "add",
        host,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ns.name(),
    ])?;
    lab.node.ip(&["link", "set", host, "up"])?;
    let mut main_result = ipam_result.clone();
    main_result["interfaces"] = json!([
        {"name": host},
        {"name": "eth0", "sandbox": attachment.netns},
    ]);
    if let Some(ips) = main_result["ips"].as_array_mut() {
        for ip in ips {
            ip["interface"] = json!(1);
        }
    }
    let result = json_of(&chain.exec(1, "ADD", &attachment, Some(&main_result))?)?;
    Pod::added(ns, attachment, result)
}

fn in_range(addr: IpAddr) -> bool {
    matches!(addr, IpAddr::V4(v4) if (2..=6).contains(&v4.octets()[3])
        && v4.octets()[..3] == [10, 90, 0])
}

#[test]
fn a_1_1_0_delegate_gets_add_check_and_the_agents_del_after_the_quarantine() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let bin = trusted_bin_dir(&lab)?;
    let log = lab.work_dir().join("host-local-1.1.log");
    let dels = lab.work_dir().join("host-local-1.1-dels");
    host_local_1_1(&bin, &log, &dels)?;
    let chain = chain_1_1(&lab, &bin)?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let wrapper_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // ADD: a 1.1.0 result with an address of the range, allocated in host-local to A.
    let a = add_1_1(&lab, &chain, "va", "vethv11a")
        .with_context(|| format!("{DELEGATE} ran: {}", wrapper_log()))?;
    ensure!(
        a.result["cniVersion"] == "1.1.0" && in_range(a.v4),
        "a 1.1.0 result with an address of {SUBNET}: {}",
        a.result
    );
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "host-local allocated {} to A: {allocations:?}",
        a.v4
    );
    api.wait_state(a.v4, StateName::Active)?;

    // CHECK with that prevResult passes through to the delegate, and ipq-cni's too.
    ipam(&chain, "CHECK", &a.attachment, Some(&a.result))?;
    chain.exec(1, "CHECK", &a.attachment, Some(&a.result))?;
    ensure!(
        wrapper_log().contains(&format!("CHECK {}", a.attachment.container_id)),
        "the CHECK reached {DELEGATE}: {}",
        wrapper_log()
    );

    // DEL, as the runtime runs the list: ipq-cni first, then the main plugin (its IPAM, then
    // its veth). ipq-ipam's DEL succeeds without running the delegate's.
    chain.exec(1, "DEL", &a.attachment, Some(&a.result))?;
    ipam(&chain, "DEL", &a.attachment, Some(&a.result))?;
    lab.node.ip(&["link", "del", "vethv11a"])?;
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&a.attachment.container_id),
        "the DEL must not free A's {} in host-local: {allocations:?}",
        a.v4
    );
    ensure!(
        !wrapper_log().contains("DEL "),
        "ipq-ipam ran no delegate DEL: {}",
        wrapper_log()
    );
    let releases = held_releases(&lab)?;
    ensure!(
        releases.len() == 1
            && releases[0].addresses == vec![a.v4]
            && releases[0].delegate_type == DELEGATE
            && releases[0].cni_version == "1.1.0",
        "the 1.1.0 release of A's {} is held: {releases:?}",
        a.v4
    );
    let not_before = deadline(&api, &a)?;
    let hold = ipq_tests::lab::poll("ipq get showing the IPAM's hold", RELEASE_WITHIN, || {
        Ok(api.get(a.v4)?.and_then(|v| v.ipam_hold))
    })?;
    ensure!(
        hold.network == chain.name
            && hold.container_id == a.attachment.container_id
            && hold.release == ipq_api::HoldRelease::AfterQuarantine,
        "{hold:?}"
    );

    // While held, a pod asking for A's address is told to try again later; the runtime then
    // DELs it (its release names no address).
    let ns = NetNs::new("vs")?;
    let wants_a = Attachment::new(format!("vs{}", ns.name().replace('-', "")), &ns)
        .with_args(format!("IgnoreUnknown=1;IP={}", a.v4));
    match ipam(&chain, "ADD", &wants_a, None) {
        Ok(result) => anyhow::bail!("CNI_ARGS IP={} must be refused: {result}", a.v4),
        Err(err) => ensure!(
            err.code == Some(11)
                && err.msg.contains(&a.v4.to_string())
                && err.msg.contains(&a.attachment.container_id),
            "code 11 naming the hold: {err}"
        ),
    }
    chain.exec(1, "DEL", &wants_a, None)?;
    ipam(&chain, "DEL", &wants_a, None)?;

    // After the quarantine the agent runs the wrapper's DEL, with the 1.1.0 config it held.
    wait_for_release(&lab, &chain, &api, &a, not_before)?;
    assert_released_once(&lab, &chain, &agent)?;
    let del: Value = serde_json::from_str(
        &std::fs::read_to_string(dels.join(format!("{}.json", a.attachment.container_id)))
            .with_context(|| format!("{DELEGATE} got A's DEL: {}", wrapper_log()))?,
    )?;
    ensure!(
        del["cniVersion"] == "1.1.0" && del["ipam"]["type"] == DELEGATE,
        "the agent's DEL is the 1.1.0 one ipq-ipam held: {del}"
    );

    // A's address can be taken now, by the pod that asked for it.
    let result = json_of(&ipam(&chain, "ADD", &wants_a, None)?)?;
    ensure!(
        result["cniVersion"] == "1.1.0" && addresses(&result)? == vec![a.v4],
        "after the release the pod asking for {} gets it: {result}",
        a.v4
    );
    let allocations = host_local_allocations(&data_dir(&lab), &chain.name)?;
    ensure!(
        allocations.get(&a.v4) == Some(&wants_a.container_id),
        "host-local allocated {} to the new pod: {allocations:?}",
        a.v4
    );
    Ok(())
}
