//! `ipq-ipam` wrapping Debian's real `host-local` under the real `bridge` and `ptp` (with
//! `ipq-cni` chained after them), run as a runtime runs them in the lab's node namespace: ADD
//! and CHECK go through to host-local, bad config is named, and a DEL never frees host-local's
//! allocation (the release is held durably for the agent), so the range is exhausted rather than
//! wrapped onto the deleted pod's address.

use std::{net::IpAddr, path::PathBuf};

use anyhow::{ensure, Context as _};
use ipq::{
    cni::{ipam::release::HeldRelease, spool},
    paths,
};
use ipq_tests::{
    cni::{addresses, host_local_allocations, ipq_ipam, Attachment, Chain},
    lab::Lab,
    netns::NetNs,
};
use serde_json::{json, Value};

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

fn add(chain: &Chain, role: &str) -> anyhow::Result<Pod> {
    let ns = NetNs::new(role)?;
    let attachment = Attachment::new(format!("{role}{}", ns.name().replace('-', "")), &ns);
    let result = chain.add(&attachment)?;
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
    Ok(())
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
