//! A real runtime (issue #4): podman 4.3 with the CNI network backend and runc, busybox
//! containers from a local rootfs, the reference `bridge` + `host-local` plugins and, chained
//! after them, `ipq-cni` talking to the real `ipq-agent` (and, in one test, host-local wrapped by
//! `ipq-ipam`).
//!
//! Everything runs in the lab's node namespace and in a private mount namespace with private
//! storage, config and IPAM data (see `ipq_tests::podman`): the machine's own network, container
//! storage and config are never touched.
//!
//! Needs root, bpffs, the workspace binaries (`cargo build -p ipq -p ipq-cni --bins`) and the Debian
//! packages podman, runc, containernetworking-plugins, busybox-static; `cargo xtask test`
//! provides them all.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use anyhow::{bail, ensure, Context as _};
use ipq::{
    api::model::{AddressView, ConflictList, ConflictView},
    registry::{ConflictKind, Holder, StateName},
};
use ipq_tests::{
    api::ipq,
    lab::{ifindex, poll, Lab},
    netns::workspace_binary,
    podman::{parse_ping, run_bounded, BridgeNetwork, Container, Podman},
};

const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

fn network(chained: Vec<String>) -> BridgeNetwork {
    BridgeNetwork {
        name: "ipqtest".to_owned(),
        bridge: "ipqbr0".to_owned(),
        subnet: "10.99.0.0/24".to_owned(),
        gateway: GATEWAY.into(),
        chained,
        ipam_wrapper: None,
    }
}

/// The runtime itself, before ipq is involved: a container on the bridge gets an address from
/// host-local, reaches its gateway, and leaves nothing behind when removed.
#[test]
fn podman_runs_a_busybox_container_on_the_cni_bridge() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let podman = Podman::new(&lab.node, network(Vec::new()), &[])?;
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 7).into();
    let a = podman.run("a", Some(addr), "while :; do sleep 1; done")?;
    let veth = podman.host_veth(&a)?;
    let link = lab.node.ip(&["-o", "link", "show", &veth])?;
    ensure!(
        link.contains("master ipqbr0"),
        "{veth} is a port of ipqbr0: {link}"
    );
    ensure!(
        podman.ipam_reservation(addr).is_file(),
        "host-local reserved {addr} in the test's dataDir"
    );
    let inside = lab_output(a.net_command("ip").args(["-o", "addr", "show", "eth0"]))?;
    ensure!(
        inside.contains(&format!("{addr}/24")),
        "the container has {addr}: {inside}"
    );
    ensure!(
        a.ping(GATEWAY.into(), 3)? == 3,
        "the container reaches its gateway"
    );

    podman.podman(&["rm", "--force", "--time", "0", "a"])?;
    poll("the host veth gone", Duration::from_secs(5), || {
        Ok(lab
            .node
            .ip(&["-o", "link", "show", &veth])
            .is_err()
            .then_some(()))
    })?;
    ensure!(
        !podman.ipam_reservation(addr).exists(),
        "CNI DEL released {addr} in host-local"
    );
    Ok(())
}

fn lab_output(cmd: &mut std::process::Command) -> anyhow::Result<String> {
    ipq_tests::netns::output_of(cmd).context("in the container's network namespace")
}

/// A's script: a graceful shutdown that takes its time, as a pod's preStop / drain would.
/// The files it touches in its rootfs tell the test where it is.
const SLOW_TO_STOP: &str =
    "trap 'touch /terminating; sleep 120; exit 0' TERM; touch /started; while :; do sleep 1; done";

/// Starts `name` with `addr`, then `podman stop`s it in the background: on return the container
/// has received SIGTERM and is still running (podman: `stopping`).
fn start_terminating(
    podman: &mut Podman<'_>,
    name: &str,
    addr: IpAddr,
) -> anyhow::Result<Container> {
    let container = podman.run(name, Some(addr), SLOW_TO_STOP)?;
    let rootfs = podman.dir().join("rootfs").join(name);
    poll(
        &format!("{name}'s shell running"),
        Duration::from_secs(10),
        || Ok(rootfs.join("started").exists().then_some(())),
    )?;
    podman.spawn(&["stop", "--time", "150", name])?;
    poll(
        &format!("{name}'s SIGTERM trap"),
        Duration::from_secs(10),
        || Ok(rootfs.join("terminating").exists().then_some(())),
    )?;
    let status = podman.status(name)?;
    ensure!(
        status == "stopping",
        "{name} is terminating, podman says {status}"
    );
    Ok(container)
}

/// The incident itself, without ipq: the IPAM frees a terminating container's address early
/// and podman gives it to a new container while the old one still uses it.
#[test]
fn without_ipq_a_terminating_containers_address_is_handed_out_again() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut podman = Podman::new(&lab.node, network(Vec::new()), &[])?;
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 9).into();
    let a = start_terminating(&mut podman, "a", addr)?;
    std::fs::remove_file(podman.ipam_reservation(addr)).context("freeing A's address")?;
    let b = podman.run("b", Some(addr), "while :; do sleep 1; done")?;
    let status = podman.status("a")?;
    ensure!(
        status == "stopping",
        "A still terminating, podman says {status}"
    );
    ensure!(a.ping(GATEWAY.into(), 3)? >= 1, "A still sends from {addr}");
    ensure!(b.ping(GATEWAY.into(), 3)? >= 1, "B sends from {addr} too");
    Ok(())
}

/// How long the agent may take to reflect what a CNI call or a packet did.
const SETTLE: Duration = Duration::from_secs(5);

/// `ipq-cni`'s entry in the conflist, after `bridge`: it talks to the lab agent's socket and
/// would spool DELs in the agent's state dir.
fn ipq_cni_entry(lab: &Lab) -> String {
    serde_json::json!({
        "type": "ipq-cni",
        "socket": lab.work_dir().join("ipq.sock"),
        "stateDir": lab.work_dir().join("state"),
        "onUnavailable": "fail",
        "timeoutMs": 5000,
    })
    .to_string()
}

/// podman on the bridge network with `ipq-cni` chained, in the lab's node namespace.
fn podman_with_ipq(lab: &Lab) -> anyhow::Result<Podman<'_>> {
    let plugin = workspace_binary("ipq-cni");
    Podman::new(
        &lab.node,
        network(vec![ipq_cni_entry(lab)]),
        &[("ipq-cni", &plugin)],
    )
}

/// The agent in the node namespace, watching the bridge ports podman's CNI creates.
fn start_agent<'l>(lab: &'l Lab, policy: &str) -> anyhow::Result<ipq_tests::lab::Agent<'l>> {
    lab.start_agent(&["--workload", "veth*", "--on-early-reuse", policy])
}

/// The agent's API as an operator sees it: the `ipq` CLI with `-o json`.
struct Ipq {
    socket: PathBuf,
}

impl Ipq {
    fn new(lab: &Lab) -> Ipq {
        Ipq {
            socket: lab.work_dir().join("ipq.sock"),
        }
    }

    /// `ipq -o json <args>`'s stdout, after checking it succeeded.
    fn json(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["-o", "json"];
        all.extend(args);
        let run = ipq(&self.socket, &all)?;
        ensure!(
            run.code == 0,
            "ipq {all:?} exited {}: {}",
            run.code,
            run.stderr
        );
        Ok(run.stdout)
    }

    fn get(&self, addr: IpAddr) -> anyhow::Result<AddressView> {
        let out = self.json(&["get", &addr.to_string()])?;
        serde_json::from_str(&out).with_context(|| format!("ipq get {addr} printed:\n{out}"))
    }

    fn conflicts(&self) -> anyhow::Result<Vec<ConflictView>> {
        let out = self.json(&["conflicts"])?;
        let list: ConflictList =
            serde_json::from_str(&out).with_context(|| format!("ipq conflicts printed:\n{out}"))?;
        Ok(list.conflicts)
    }

    /// Polls `addr`'s view until `want` holds; the error shows the last view.
    fn wait(
        &self,
        addr: IpAddr,
        what: &str,
        want: impl Fn(&AddressView) -> bool,
    ) -> anyhow::Result<AddressView> {
        poll(&format!("{addr}: {what}"), SETTLE, || {
            let view = self.get(addr)?;
            if want(&view) {
                Ok(Some(view))
            } else {
                bail!("{view:?}")
            }
        })
    }
}

/// Whether `holder` is `container`'s attachment: its host veth, its id, `eth0`.
fn is(holder: Option<&Holder>, container: &Container, veth: &str) -> bool {
    holder.is_some_and(|h| {
        h.ifname == veth
            && h.container_id() == Some(container.id.as_str())
            && h.cni_ifname().is_none_or(|i| i == "eth0")
    })
}

/// The early-reuse conflict recorded for `addr` between `old` and `new`.
fn early_reuse_between(
    conflicts: &[ConflictView],
    addr: IpAddr,
    (old, old_veth): (&Container, &str),
    new_id: &str,
) -> Option<ConflictView> {
    conflicts
        .iter()
        .find(|c| {
            c.kind == ConflictKind::EarlyReuse
                && c.address == addr
                && is(c.old_holder.as_ref(), old, old_veth)
                && c.new_holder
                    .as_ref()
                    .is_some_and(|h| h.container_id() == Some(new_id))
        })
        .cloned()
}

/// `ping -c n` from the node to `dst`; replies received.
fn ping_from_node(lab: &Lab, dst: IpAddr, n: u32) -> anyhow::Result<u32> {
    let out = run_bounded(
        lab.node
            .command("ping")
            .args(["-n", "-q", "-c", &n.to_string(), "-i", "0.05", "-W", "1"])
            .arg(dst.to_string()),
        Duration::from_secs(20),
    )?;
    parse_ping(&out, dst)
}

/// The MAC the node's neighbour table has for `addr` on the bridge.
fn node_neighbour(lab: &Lab, addr: IpAddr) -> anyhow::Result<Option<String>> {
    let out = lab
        .node
        .ip(&["neigh", "show", &addr.to_string(), "dev", "ipqbr0"])?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_owned))
}

/// refuse-new: while A terminates with the address the IPAM already freed, podman cannot start
/// B with it: ipq-cni fails B's ADD with "try again later", A keeps the address untouched, and
/// the conflict is on record with both holders.
#[test]
fn refuse_new_fails_the_start_of_a_container_given_a_terminating_ones_address() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    let agent = start_agent(&lab, "refuse-new")?;
    let mut podman = podman_with_ipq(&lab)?;
    let api = Ipq::new(&lab);
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 20).into();

    let a = start_terminating(&mut podman, "a", addr)?;
    let veth_a = podman.host_veth(&a)?;
    api.wait(addr, "A holds it (CNI ADD)", |v| {
        v.state == StateName::Active && is(v.holder.as_ref(), &a, &veth_a)
    })?;
    ensure!(
        a.ping(GATEWAY.into(), 3)? == 3,
        "A, terminating, still flows"
    );

    std::fs::remove_file(podman.ipam_reservation(addr)).context("freeing A's address")?;
    let out = podman.try_run("b", Some(addr), "while :; do sleep 1; done")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "podman run of B with {addr} must fail while A holds it; it printed: {stderr}"
    );
    // podman prints a plugin's CNI error as `plugin type="ipq-cni" failed (add): <msg>:
    // <details>` (the code, 11 "try again later", is not shown): the message must say which
    // holder has the address and that B may try again.
    let veth = &veth_a;
    ensure!(
        stderr.contains(r#"plugin type="ipq-cni" failed (add)"#)
            && stderr.contains(&addr.to_string())
            && stderr.contains(&a.id)
            && stderr.contains(veth)
            && stderr.to_lowercase().contains("try again"),
        "podman's error carries ipq-cni's refusal ({addr} held by {} on {veth}, try again): \
         {stderr}",
        a.id
    );
    let b_id = podman
        .podman(&["inspect", "-f", "{{.Id}}", "b"])?
        .trim()
        .to_owned();
    let status = podman.status("b")?;
    ensure!(status != "running", "B must not run, podman says {status}");

    // Nothing changed for A, even after podman's clean-up DEL of B's failed attachment.
    let view = api.get(addr)?;
    ensure!(
        view.state == StateName::Active
            && is(view.holder.as_ref(), &a, &veth_a)
            && view.fenced.is_none(),
        "A keeps {addr}, unfenced: {view:?}"
    );
    ensure!(a.ping(GATEWAY.into(), 3)? == 3, "A keeps flowing");
    let conflicts = api.conflicts()?;
    let conflict = early_reuse_between(&conflicts, addr, (&a, &veth_a), &b_id)
        .with_context(|| format!("an early_reuse of {addr} from A to B in {conflicts:#?}"))?;
    ensure!(
        conflict.policy == ipq_api::EarlyReusePolicy::RefuseNew
            && conflict.outcome == ipq_api::ConflictOutcome::RefusedNew,
        "{conflict:?}"
    );
    ensure!(
        agent.metric("ipq_refused_claims_total", &[])? >= 1.0,
        "the refusal is counted"
    );

    // A's grace period ends (podman kills it): its CNI DEL drains the address, its veth goes,
    // the address cools down in quarantine. B's retry is refused again, until the operator
    // ends the quarantine; then B starts with the address.
    podman.podman(&["rm", "--force", "--time", "0", "a"])?;
    let view = api.wait(addr, "quarantined after A", |v| {
        v.state == StateName::Quarantined
    })?;
    ensure!(
        is(view.previous_holder.as_ref(), &a, &veth_a),
        "A was the holder: {view:?}"
    );
    let out = podman.podman_output(&["start", "b"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success()
            && stderr.contains(r#"plugin type="ipq-cni" failed (add)"#)
            && stderr.contains(&addr.to_string()),
        "B's retry during the quarantine is refused by ipq-cni: {stderr}"
    );
    let conflicts = api.conflicts()?;
    ensure!(
        conflicts
            .iter()
            .any(|c| c.kind == ConflictKind::ReuseInCooldown
                && c.address == addr
                && is(c.old_holder.as_ref(), &a, &veth_a)
                && c.new_holder
                    .as_ref()
                    .is_some_and(|h| h.container_id() == Some(b_id.as_str()))),
        "a reuse_in_cooldown of {addr} from A to B in {conflicts:#?}"
    );
    let run = ipq(&api.socket, &["release", "--force", &addr.to_string()])?;
    ensure!(run.code == 0, "ipq release --force {addr}: {}", run.stderr);
    podman
        .podman(&["start", "b"])
        .context("B starts once the address is released")?;
    let b = podman.container("b")?;
    let veth_b = podman.host_veth(&b)?;
    api.wait(addr, "B holds it", |v| {
        v.state == StateName::Active && is(v.holder.as_ref(), &b, &veth_b)
    })?;
    ensure!(b.ping(GATEWAY.into(), 3)? == 3, "B flows with {addr}");
    Ok(())
}

/// fence-old: B starts with the terminating A's address; A is fenced: from the node the
/// address answers from B, B reaches its gateway, A's packets with it are dropped. The API
/// shows B as holder, A as the fenced one, and the conflict with both.
#[test]
fn fence_old_gives_the_address_to_the_new_container_and_cuts_the_old_one_off() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    let _agent = start_agent(&lab, "fence-old")?;
    let mut podman = podman_with_ipq(&lab)?;
    let api = Ipq::new(&lab);
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 30).into();

    let a = start_terminating(&mut podman, "a", addr)?;
    let veth_a = podman.host_veth(&a)?;
    api.wait(addr, "A holds it (CNI ADD)", |v| {
        v.state == StateName::Active && is(v.holder.as_ref(), &a, &veth_a)
    })?;
    ensure!(
        a.ping(GATEWAY.into(), 3)? == 3,
        "A, terminating, still flows"
    );

    std::fs::remove_file(podman.ipam_reservation(addr)).context("freeing A's address")?;
    let b = podman
        .run("b", Some(addr), "while :; do sleep 1; done")
        .context("B must start under fence-old")?;
    let veth_b = podman.host_veth(&b)?;
    let status = podman.status("a")?;
    ensure!(
        status == "stopping",
        "A still terminating, podman says {status}"
    );

    let view = api.wait(addr, "B holds it, A fenced", |v| {
        is(v.holder.as_ref(), &b, &veth_b) && is(v.fenced.as_ref(), &a, &veth_a)
    })?;
    ensure!(view.state == StateName::Active, "{view:?}");
    let entry = lab
        .maps()
        .entry(addr)?
        .with_context(|| format!("{addr} in the datapath map"))?;
    ensure!(
        entry.holder == ifindex(&lab.node, &veth_b)?
            && entry.fenced == ifindex(&lab.node, &veth_a)?,
        "the datapath has B as holder and A fenced: {entry:?}"
    );
    let conflicts = api.conflicts()?;
    let conflict = early_reuse_between(&conflicts, addr, (&a, &veth_a), &b.id)
        .with_context(|| format!("an early_reuse of {addr} from A to B in {conflicts:#?}"))?;
    ensure!(
        conflict.policy == ipq_api::EarlyReusePolicy::FenceOld
            && conflict.outcome == ipq_api::ConflictOutcome::FencedOld,
        "{conflict:?}"
    );

    // Real traffic: B has the address, A is cut off, and A's tries do not steal it back.
    let (_, mac_b) = b.eth0()?;
    ensure!(
        b.ping(GATEWAY.into(), 3)? == 3,
        "B reaches its gateway from {addr}"
    );
    ensure!(
        ping_from_node(&lab, addr, 3)? == 3,
        "{addr} answers the node"
    );
    ensure!(
        node_neighbour(&lab, addr)?.as_deref() == Some(mac_b.as_str()),
        "the node resolved {addr} to B ({mac_b})"
    );
    ensure!(
        a.ping(GATEWAY.into(), 3)? == 0,
        "A's packets from {addr} are dropped"
    );
    ensure!(
        ping_from_node(&lab, addr, 3)? == 3,
        "{addr} still answers the node"
    );
    ensure!(
        node_neighbour(&lab, addr)?.as_deref() == Some(mac_b.as_str()),
        "after A's tries the node still resolves {addr} to B ({mac_b})"
    );

    // A's grace period ends: the late CNI DEL of the fenced old holder and the loss of its
    // veth leave B's address alone.
    podman.podman(&["rm", "--force", "--time", "0", "a"])?;
    poll("A's veth gone", SETTLE, || {
        Ok(lab
            .node
            .ip(&["link", "show", &veth_a])
            .is_err()
            .then_some(()))
    })?;
    let view = api.wait(addr, "B holds it, A forgotten", |v| {
        v.state == StateName::Active && is(v.holder.as_ref(), &b, &veth_b) && v.fenced.is_none()
    })?;
    ensure!(view.conflicts >= 1, "the conflict stays counted: {view:?}");
    ensure!(b.ping(GATEWAY.into(), 3)? == 3, "B still flows with {addr}");
    ensure!(
        ping_from_node(&lab, addr, 3)? == 3,
        "{addr} still answers the node"
    );
    Ok(())
}

/// The same hold through podman (issue #18): host-local wrapped by ipq-ipam in podman's
/// conflist, ipq-cni chained. A container asking for a static address (`--ip`, the `ips`
/// capability) gets it; once removed, the next container asking for it is refused with error
/// 11 naming the address while its quarantine runs, and gets it once the agent has released
/// host-local's allocation.
#[test]
fn podman_with_ipq_ipam_holds_a_removed_containers_address_until_its_quarantine_ends(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut net = network(vec![ipq_cni_entry(&lab)]);
    net.ipam_wrapper = Some(serde_json::json!({
        "type": "ipq-ipam",
        "socket": lab.work_dir().join("ipq.sock"),
        "stateDir": lab.work_dir().join("state"),
        "timeoutMs": 5000,
    }));
    let (cni, ipam) = (workspace_binary("ipq-cni"), workspace_binary("ipq-ipam"));
    let podman = Podman::new(&lab.node, net, &[("ipq-cni", &cni), ("ipq-ipam", &ipam)])?;
    // podman's CNI_PATH is its own plugin dir: the agent runs host-local's DEL from there.
    let bin_dir = podman.dir().join("cni-bin");
    let mut args = vec![
        "--ipam-cni-bin-dirs",
        bin_dir.to_str().context("a UTF-8 path")?,
    ];
    args.extend(ipq_tests::lab::SHORT_QUARANTINE);
    let _agent = lab.start_agent(&args)?;
    let ipq = Ipq::new(&lab);
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 9).into();

    podman.run("a", Some(addr), "while :; do sleep 1; done")?;
    ipq.wait(addr, "held by a", |v| v.state == StateName::Active)?;
    podman.podman(&["rm", "--force", "--time", "0", "a"])?;
    let quarantined = ipq.wait(addr, "quarantined", |v| v.state == StateName::Quarantined)?;
    let until = quarantined
        .until
        .as_deref()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .context("a quarantine has a deadline")?;

    let refused = podman.try_run("b", Some(addr), "while :; do sleep 1; done")?;
    let said = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        !refused.status.success() && said.contains(&addr.to_string()) && said.contains("until"),
        "B asking for {addr} during A's quarantine must be refused naming it: {said}"
    );
    ensure!(
        std::time::SystemTime::now() < until,
        "refused during the quarantine"
    );
    podman.podman(&["rm", "--force", "--time", "0", "b"]).ok();

    // Each try is a container of its own (a name has its rootfs).
    let tries = std::cell::Cell::new(0);
    poll(
        "B given the address after the release",
        Duration::from_secs(30),
        || {
            tries.set(tries.get() + 1);
            let name = format!("b{}", tries.get());
            let out = podman.try_run(&name, Some(addr), "while :; do sleep 1; done")?;
            if out.status.success() {
                return Ok(Some(()));
            }
            podman.podman(&["rm", "--force", "--time", "0", &name]).ok();
            Ok(None)
        },
    )?;
    ensure!(
        std::time::SystemTime::now() >= until,
        "not before the deadline"
    );
    ipq.wait(addr, "held by b", |v| v.state == StateName::Active)?;
    // Its containers' DELs at drop go to the running agent, as before it was started second.
    drop(podman);
    Ok(())
}
