//! `ipq-cni` chained after the real Debian CNI plugins (bridge or ptp, host-local IPAM), run as
//! a runtime runs them, inside the lab's node namespace, against the real agent: the agent's
//! view after each step, early reuse forced through host-local's `IP` argument under both
//! policies (checked with real traffic), GC and STATUS, and a DEL spooled while the agent is
//! down.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use ipq::{
    api::{client::ClientError, model::AddressView},
    registry::StateName,
};
use ipq_fs::paths;
use ipq_tests::{
    cni::{addresses, host_interface, AgentApi as Api, Attachment, Chain, PluginError},
    lab::{ifindex, map_entry, udp_burst, wait_for_entry, Lab},
    netns::NetNs,
};
use serde_json::{json, Value};

const BRIDGE: &str = "cniipq0";
const BRIDGE_GW_V4: &str = "10.91.0.1";
/// Long enough for a veth's removal to reach the agent through netlink on a loaded machine.
const SETTLE: Duration = Duration::from_secs(10);

/// The agent's view of `addr` is `state`, held by `container` on `host_if`.
fn assert_held(
    api: &Api,
    addr: IpAddr,
    state: StateName,
    container: &str,
    host_if: &str,
) -> anyhow::Result<AddressView> {
    let view = api.wait_state(addr, state)?;
    let holder = view
        .holder
        .as_ref()
        .with_context(|| format!("{addr} has no holder: {view:?}"))?;
    ensure!(
        holder.container_id() == Some(container)
            && holder.ifname == host_if
            && holder.cni_ifname() == Some("eth0"),
        "{addr} must be held by container {container} on {host_if} (eth0): {view:?}"
    );
    Ok(view)
}

/// host-local's data dir and the agent's state dir, inside the lab's work dir.
fn data_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("cni-data")
}

fn state_dir(lab: &Lab) -> PathBuf {
    lab.work_dir().join("state")
}

fn ipam(lab: &Lab, v4: &str, v6: &str) -> Value {
    json!({
        "type": "host-local",
        "dataDir": data_dir(lab),
        "ranges": [[{"subnet": v4}], [{"subnet": v6}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    })
}

/// ipq-cni's entry, pointed at the lab's agent.
fn ipq_entry(lab: &Lab) -> Value {
    json!({
        "type": "ipq-cni",
        "socket": lab.work_dir().join("ipq.sock"),
        "stateDir": state_dir(lab),
        "onUnavailable": "fail",
        "timeoutMs": 2000,
    })
}

fn bridge_chain<'l>(lab: &'l Lab, version: &str) -> anyhow::Result<Chain<'l>> {
    let bridge = json!({
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": true,
        "ipMasq": false,
        "ipam": ipam(lab, "10.91.0.0/24", "fd91::/64"),
    });
    Chain::new(
        &lab.node,
        format!("ipq-br-{}", std::process::id()),
        version,
        vec![bridge, ipq_entry(lab)],
    )
}

fn ptp_chain<'l>(lab: &'l Lab, version: &str) -> anyhow::Result<Chain<'l>> {
    let ptp = json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": ipam(lab, "10.92.0.0/24", "fd92::/64"),
    });
    Chain::new(
        &lab.node,
        format!("ipq-ptp-{}", std::process::id()),
        version,
        vec![ptp, ipq_entry(lab)],
    )
}

/// One container of a test: its namespace, attachment and ADD result.
struct Container {
    ns: NetNs,
    attachment: Attachment,
    result: Value,
    host_if: String,
    addrs: Vec<IpAddr>,
}

impl Container {
    fn v4(&self) -> IpAddr {
        *self
            .addrs
            .iter()
            .find(|a| a.is_ipv4())
            .expect("a v4 address")
    }
}

/// A fresh namespace `role`, ADDed through `chain` as container `id`, with `args`.
fn add(chain: &Chain, role: &str, args: Option<String>) -> anyhow::Result<Container> {
    let ns = NetNs::new(role)?;
    let id = format!("{role}{}", ns.name().replace('-', ""));
    let mut attachment = Attachment::new(id, &ns);
    attachment.args = args;
    let result = chain.add(&attachment)?;
    let host_if = host_interface(&result, Some(BRIDGE))?;
    let addrs = addresses(&result)?;
    Ok(Container {
        ns,
        attachment,
        result,
        host_if,
        addrs,
    })
}

fn ipq_index(chain: &Chain) -> usize {
    chain.plugins.len() - 1
}

/// ADD, CHECK and DEL of three containers through `chain`, with the agent's view after each
/// step.
fn add_check_del(lab: &Lab, chain: &Chain) -> anyhow::Result<()> {
    let api = Api::new(lab)?;
    let mut containers = Vec::new();
    for role in ["ca", "cb", "cc"] {
        let c = add(
            chain,
            role,
            Some(format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={role}"
            )),
        )?;
        ensure!(
            c.addrs.len() == 2,
            "one v4 and one v6 address: {}",
            c.result
        );
        ensure!(
            c.result["cniVersion"] == chain.cni_version.as_str(),
            "the result speaks the chain's version: {}",
            c.result
        );
        let host_index = ifindex(&lab.node, &c.host_if)?;
        for addr in &c.addrs {
            let view = assert_held(
                &api,
                *addr,
                StateName::Active,
                &c.attachment.container_id,
                &c.host_if,
            )?;
            let pod = view
                .holder
                .and_then(|h| h.pod().cloned())
                .context("pod identity from CNI_ARGS")?;
            ensure!(pod.namespace == "default" && pod.name == role, "{pod:?}");
            wait_for_entry(lab, *addr, &map_entry("active", host_index, 0), SETTLE);
        }
        containers.push(c);
    }
    // ipq-cni passes the previous result on unchanged, and a repeated ADD is a no-op claim.
    let first = &containers[0];
    let started = Instant::now();
    let again = chain.exec(
        ipq_index(chain),
        "ADD",
        &first.attachment,
        Some(&first.result),
    )?;
    let took = started.elapsed();
    ensure!(
        serde_json::from_str::<Value>(&again)? == first.result,
        "ipq-cni changed the result: {again} vs {}",
        first.result
    );
    eprintln!("ipq-cni ADD (process start to exit, debug build): {took:?}");
    ensure!(took < Duration::from_secs(1), "ipq-cni ADD took {took:?}");
    // The pods are reachable through ipq: nothing of theirs is dropped.
    for c in &containers {
        for addr in &c.addrs {
            let got = udp_burst(&lab.node, &c.ns, *addr, 5);
            ensure!(
                got == 5,
                "node → {addr} ({}): {got} of 5 arrived",
                c.attachment.container_id
            );
        }
        chain.check(&c.attachment, &c.result)?;
    }
    // DEL of the first: ipq-cni first (Draining, the veth still there), then the interface
    // plugin (the veth gone: Quarantined).
    let first = &containers[0];
    chain.exec(
        ipq_index(chain),
        "DEL",
        &first.attachment,
        Some(&first.result),
    )?;
    for addr in &first.addrs {
        assert_held(
            &api,
            *addr,
            StateName::Draining,
            &first.attachment.container_id,
            &first.host_if,
        )?;
    }
    // A DEL is idempotent: the runtime may repeat it.
    chain.exec(
        ipq_index(chain),
        "DEL",
        &first.attachment,
        Some(&first.result),
    )?;
    chain.exec(0, "DEL", &first.attachment, Some(&first.result))?;
    for addr in &first.addrs {
        api.wait_state(*addr, StateName::Quarantined)?;
    }
    // The others are untouched, then go the whole-chain way (and a DEL without prevResult).
    for c in &containers[1..] {
        for addr in &c.addrs {
            assert_held(
                &api,
                *addr,
                StateName::Active,
                &c.attachment.container_id,
                &c.host_if,
            )?;
        }
    }
    chain.del(&containers[1].attachment, Some(&containers[1].result))?;
    chain.del(&containers[2].attachment, None)?;
    for c in &containers[1..] {
        for addr in &c.addrs {
            api.wait_state(*addr, StateName::Quarantined)?;
        }
    }
    Ok(())
}

#[test]
fn bridge_host_local_ipq_cni_add_check_del() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*"])?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    add_check_del(&lab, &chain)
}

#[test]
fn ptp_host_local_ipq_cni_add_check_del() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*"])?;
    let chain = ptp_chain(&lab, "0.4.0")?;
    add_check_del(&lab, &chain)
}

/// Frees `addr` in host-local's data dir as an IPAM that hands addresses out too early would.
fn release_reservation(lab: &Lab, chain: &Chain, addr: IpAddr) -> anyhow::Result<()> {
    let file = data_dir(lab).join(&chain.name).join(addr.to_string());
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))
}

/// `IP=<addr>` for host-local, with the pod's identity.
fn reuse_args(addr: IpAddr, pod: &str) -> String {
    format!("IgnoreUnknown=1;IP={addr};K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}")
}

fn gateway() -> IpAddr {
    BRIDGE_GW_V4.parse().expect("valid")
}

#[test]
fn early_reuse_under_refuse_new_fails_with_try_again_later() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*", "--on-early-reuse", "refuse-new"])?;
    let api = Api::new(&lab)?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let old = add(&chain, "old", None)?;
    let addr = old.v4();
    assert_held(
        &api,
        addr,
        StateName::Active,
        &old.attachment.container_id,
        &old.host_if,
    )?;

    release_reservation(&lab, &chain, addr)?;
    let err = match add(&chain, "new", Some(reuse_args(addr, "new"))) {
        Ok(new) => bail!(
            "the ADD of {addr} over a live holder succeeded: {}",
            new.result
        ),
        Err(e) => e.downcast::<PluginError>()?,
    };
    ensure!(err.plugin == "ipq-cni" && err.code == Some(11), "{err}");
    for needle in [
        addr.to_string(),
        old.attachment.container_id.clone(),
        old.host_if.clone(),
    ] {
        ensure!(
            err.msg.contains(&needle),
            "{needle:?} not in the refusal: {err}"
        );
    }
    // Nothing changed for the old holder: it keeps the address, unfenced, and its traffic.
    let view = assert_held(
        &api,
        addr,
        StateName::Active,
        &old.attachment.container_id,
        &old.host_if,
    )?;
    ensure!(view.fenced.is_none(), "{view:?}");
    let got = udp_burst(&old.ns, &lab.node, gateway(), 5);
    ensure!(got == 5, "the old holder's traffic: {got} of 5 arrived");
    chain.check(&old.attachment, &old.result)?;
    Ok(())
}

#[test]
fn early_reuse_under_fence_old_fences_the_old_holder() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*", "--on-early-reuse", "fence-old"])?;
    let api = Api::new(&lab)?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let old = add(&chain, "old", None)?;
    let addr = old.v4();
    let got = udp_burst(&old.ns, &lab.node, gateway(), 5);
    ensure!(
        got == 5,
        "before the reuse the old holder's traffic flows: {got} of 5"
    );

    release_reservation(&lab, &chain, addr)?;
    let new = add(&chain, "new", Some(reuse_args(addr, "new")))?;
    ensure!(
        new.v4() == addr,
        "host-local honoured IP={addr}: {}",
        new.result
    );
    let view = assert_held(
        &api,
        addr,
        StateName::Active,
        &new.attachment.container_id,
        &new.host_if,
    )?;
    let fenced = view.fenced.as_ref().context("the old holder is fenced")?;
    ensure!(
        fenced.container_id() == Some(old.attachment.container_id.as_str()),
        "{view:?}"
    );
    let (old_index, new_index) = (
        ifindex(&lab.node, &old.host_if)?,
        ifindex(&lab.node, &new.host_if)?,
    );
    wait_for_entry(
        &lab,
        addr,
        &map_entry("active", new_index, old_index),
        SETTLE,
    );

    // Real traffic: the old holder's packets with the address are dropped, the new one's flow
    // (and tell the node where the address lives now), and the node reaches the new one.
    let got = udp_burst(&old.ns, &lab.node, gateway(), 5);
    ensure!(
        got == 0,
        "the fenced old holder's traffic must be dropped: {got} of 5 arrived"
    );
    let got = udp_burst(&new.ns, &lab.node, gateway(), 5);
    ensure!(got == 5, "the new holder's traffic: {got} of 5 arrived");
    let got = udp_burst(&lab.node, &new.ns, addr, 5);
    ensure!(
        got == 5,
        "node → {addr} reaches the new holder: {got} of 5 arrived"
    );

    // CHECK tells each attachment where it stands: the old one lost its claim.
    chain.check(&new.attachment, &new.result)?;
    let err = chain
        .check(&old.attachment, &old.result)
        .err()
        .context("CHECK of the fenced old holder must fail")?;
    ensure!(err.plugin == "ipq-cni" && err.code == Some(100), "{err}");
    ensure!(
        err.msg.contains("fenced") && err.msg.contains(&new.attachment.container_id),
        "{err}"
    );

    // The old pod's late DEL leaves the new holder alone.
    chain.del(&old.attachment, Some(&old.result))?;
    assert_held(
        &api,
        addr,
        StateName::Active,
        &new.attachment.container_id,
        &new.host_if,
    )?;
    Ok(())
}

#[test]
fn early_reuse_under_observe_keeps_the_claimants_identity() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let _agent = lab.start_agent(&["--workload", "veth*", "--on-early-reuse", "observe"])?;
    let api = Api::new(&lab)?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let old = add(&chain, "old", None)?;
    let addr = old.v4();
    release_reservation(&lab, &chain, addr)?;
    let new = add(&chain, "new", Some(reuse_args(addr, "new")))?;
    assert_held(
        &api,
        addr,
        StateName::Active,
        &new.attachment.container_id,
        &new.host_if,
    )?;

    // Both flow (observe), and the old holder's traffic refreshing the bridge's neighbour and
    // forwarding entries does not take the address back from the CNI claimant.
    let got = udp_burst(&old.ns, &lab.node, gateway(), 5);
    ensure!(got == 5, "observe lets the old holder flow: {got} of 5");
    let got = udp_burst(&new.ns, &lab.node, gateway(), 5);
    ensure!(got == 5, "the new holder's traffic: {got} of 5");
    let got = udp_burst(&old.ns, &lab.node, gateway(), 5);
    ensure!(got == 5, "observe lets the old holder flow: {got} of 5");
    // Every neighbour and forwarding-entry event of that traffic has reached the agent.
    api.netlink_barrier(&lab.node)?;
    assert_held(
        &api,
        addr,
        StateName::Active,
        &new.attachment.container_id,
        &new.host_if,
    )?;
    // So the claimant's DEL still finds what it holds.
    chain.del(&new.attachment, Some(&new.result))?;
    ensure!(
        api.get(addr)?.map(|v| v.state) != Some(StateName::Active),
        "the new holder's DEL drained {addr}"
    );
    Ok(())
}

fn ipq_config(lab: &Lab, version: &str) -> Value {
    let mut conf = ipq_entry(lab);
    conf["name"] = json!("ipq-gc");
    conf["cniVersion"] = json!(version);
    conf
}

#[test]
fn gc_drains_what_is_not_valid_and_status_follows_the_agent() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut agent = lab.start_agent(&["--workload", "veth*"])?;
    let api = Api::new(&lab)?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let kept = add(&chain, "kept", None)?;
    let gone = add(&chain, "gone", None)?;

    // The Debian plugins predate 1.1.0: GC and STATUS go to ipq-cni alone.
    chain.exec_config("STATUS", None, &ipq_config(&lab, "1.1.0"))?;
    let err = chain
        .exec_config("STATUS", None, &ipq_config(&lab, "1.0.0"))
        .err()
        .context("STATUS needs a 1.1.0 config")?;
    ensure!(err.code == Some(1), "{err}");

    // A GC of another network listing nothing leaves this network's attachments alone.
    let mut other = ipq_config(&lab, "1.1.0");
    other["cni.dev/valid-attachments"] = json!([]);
    chain.exec_config("GC", None, &other)?;
    for addr in kept.addrs.iter().chain(&gone.addrs) {
        ensure!(
            api.get(*addr)?.map(|v| v.state) == Some(StateName::Active),
            "a GC of network ipq-gc drained {addr} of network {}",
            chain.name
        );
    }

    let mut gc = ipq_config(&lab, "1.1.0");
    gc["name"] = json!(chain.name);
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": kept.attachment.container_id, "ifname": "eth0"},
    ]);
    chain.exec_config("GC", None, &gc)?;
    for addr in &kept.addrs {
        assert_held(
            &api,
            *addr,
            StateName::Active,
            &kept.attachment.container_id,
            &kept.host_if,
        )?;
    }
    for addr in &gone.addrs {
        assert_held(
            &api,
            *addr,
            StateName::Draining,
            &gone.attachment.container_id,
            &gone.host_if,
        )?;
    }

    agent.terminate()?;
    let err = chain
        .exec_config("STATUS", None, &ipq_config(&lab, "1.1.0"))
        .err()
        .context("STATUS with the agent stopped must fail")?;
    ensure!(err.code == Some(50), "{err}");
    ensure!(
        err.msg.contains("ipq.sock"),
        "the reason names the socket: {err}"
    );
    Ok(())
}

fn spooled_files(dir: &Path) -> anyhow::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

#[test]
fn a_del_while_the_agent_is_down_is_spooled_and_replayed() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let args = ["--workload", "veth*"];
    let mut agent = lab.start_agent(&args)?;
    let api = Api::new(&lab)?;
    let chain = bridge_chain(&lab, "1.0.0")?;
    let c = add(&chain, "spool", None)?;
    for addr in &c.addrs {
        assert_held(
            &api,
            *addr,
            StateName::Active,
            &c.attachment.container_id,
            &c.host_if,
        )?;
    }

    agent.terminate()?;
    match api.runtime.block_on(api.client.status()) {
        Err(ClientError::Unavailable { .. }) => {}
        other => bail!("the agent must be down: {other:?}"),
    }
    // ipq-cni's DEL succeeds with the agent down; the veth still exists.
    chain.exec(ipq_index(&chain), "DEL", &c.attachment, Some(&c.result))?;
    let spool = paths::cni_spool_dir(&state_dir(&lab));
    let files = spooled_files(&spool)?;
    ensure!(
        files.len() == 1,
        "one spooled DEL in {}: {files:?}",
        spool.display()
    );

    drop(agent);
    let _agent = lab.start_agent(&args)?;
    for addr in &c.addrs {
        assert_held(
            &api,
            *addr,
            StateName::Draining,
            &c.attachment.container_id,
            &c.host_if,
        )?;
    }
    let files = spooled_files(&spool)?;
    ensure!(
        files.is_empty(),
        "the replayed DEL is removed from the spool: {files:?}"
    );

    chain.exec(0, "DEL", &c.attachment, Some(&c.result))?;
    for addr in &c.addrs {
        api.wait_state(*addr, StateName::Quarantined)?;
    }
    Ok(())
}
