//! Upgrade and rollback node by node (#37 item 2) on the three flannel nodes, with long-lived
//! flows through every node (Cilium's conn-disrupt pattern) and a fenced holder on every node.
//!
//! - Flows: an echo server pod on each node, and on each node a client pod holding one TCP
//!   connection to the server of the next node (through flannel's vxlan) for the whole phase, a
//!   line every 150 ms. A client whose connection ends, or whose echo is late by more than
//!   [`STALL_SECS`], prints so and exits for good (it never reconnects): the test reads its
//!   container's state, restart count and echo counter.
//! - Fenced holders: on each node a pod that ignores SIGTERM pings the peer (the witness, which
//!   tells pods apart by payload size: flannel's masquerade gives the node's source address),
//!   is deleted, and its address is handed by host-local to a new pod on the same node while
//!   it still runs: ipq fences it (fence-old), and its node's NodeQuarantine lists it.
//! - The roll: ipq's DaemonSet back to the previous release (its chart and its image, built from
//!   the commit `xtask/previous-release.toml` names: [`image::IPQ_IMAGE_PREVIOUS`]) with `helm
//!   upgrade <its chart> --reuse-values --set image.tag=...`, then forward again to this tree's
//!   with `helm rollback` to the installed revision: the rollback and the upgrade users do, each
//!   taking over the other version's pins, journal, reservations and NodeQuarantines. Each
//!   waited for until every node's agent is a new pod, ready, on the revision's image.
//!
//! Proven from what was recorded throughout (a `kubectl get --watch` of the agents' pods and one
//! of the NodeQuarantines), not by sampling at the end: each roll went one node at a time, as
//! the DaemonSet's `maxUnavailable` says (never more nodes without a ready agent, each node
//! once per roll); no flow broke; the witness got none of the fenced holders' pings from the
//! first roll's start to the rollback's end; every node's NodeQuarantine listed its fenced
//! holder in every version of it from before the roll to after it, while that holder lived.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use ipq_tests::cluster::{
    deploy::{agent_pod_on, ipq_on, AGENT_SELECTOR, DAEMONSET, NAMESPACE},
    flannel,
    image::{self, IPQ_IMAGE, IPQ_IMAGE_PREVIOUS},
    kubectl::pod_ready,
    node,
    peer::Witness,
    tasks,
    watch::{Recorded, Watch},
    workloads::{self, ECHOED_FILE},
    Cluster,
};
use serde_json::Value;

use super::agent_lifecycle::{pod_name, wait_rolled};

/// Each node's (by index) fenced and live holder's ping signature at the witness.
const STALE: [usize; 3] = [131, 132, 133];
const LIVE: [usize; 3] = [141, 142, 143];
const ECHO_PORT: u16 = 7007;
/// A flow whose echo is later than this counts as broken.
const STALL_SECS: u32 = 3;
/// The label of every pod of the phase.
const APP: &str = "rolling";

/// A node's fenced holder and the live one that took its address.
struct Fenced {
    node: String,
    address: String,
    stale: String,
    live: String,
    index: usize,
}

/// A client on `node` holding a connection to the server on the next node.
struct Flow {
    client: String,
    server_address: String,
}

pub fn upgrade_and_rollback_node_by_node(cluster: &mut Cluster) -> anyhow::Result<()> {
    let nodes: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    ensure!(nodes.len() == STALE.len(), "the phase runs on 3 nodes");
    let previous = image::previous_release()?;
    let archive = image::build_previous(&cluster.host.dir().join("ipq-image-previous"), &previous)?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    let witness = Witness::start(&cluster.host.peer)?;
    let quarantines = Watch::start(
        cluster,
        "nodequarantines-watch",
        &["get", "nodequarantines"],
    )?;
    let agents = Watch::start(
        cluster,
        "agent-pods-watch",
        &["-n", NAMESPACE, "get", "pods", "-l", AGENT_SELECTOR],
    )?;

    let fenced = fence_a_holder_on_every_node(cluster, &nodes, &witness)?;
    let flows = open_flows(cluster, &nodes)?;
    quarantines.wait_for(
        "the recorded NodeQuarantines to list every node's fenced holder",
        Duration::from_secs(30),
        |events| fenced.iter().all(|f| first_listing(events, f).is_some()),
    )?;
    let echoed_before = flows
        .iter()
        .map(|f| echoed(cluster, &f.client))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let ds = cluster
        .kubectl()
        .json(&["-n", NAMESPACE, "get", "daemonset", DAEMONSET])?;
    let max_unavailable = &ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    ensure!(
        *max_unavailable == 1,
        "the chart's DaemonSet rolls {max_unavailable} nodes at a time, not one"
    );
    let installed = cluster.helm()?.revision()?;
    let tag = IPQ_IMAGE_PREVIOUS.rsplit_once(':').context("a tag")?.1;
    let set = format!("image.tag={tag}");
    let chart = previous.chart();
    let began = Instant::now();
    let rolled_back = roll(
        cluster,
        &agents,
        IPQ_IMAGE_PREVIOUS,
        &format!(
            "helm upgrade to the previous release {} ({}) --set {set}",
            previous.commit,
            chart.display()
        ),
        |c| c.helm()?.upgrade_to(&chart, &[&set]),
    )?;
    let upgraded = roll(
        cluster,
        &agents,
        IPQ_IMAGE,
        &format!("helm rollback {installed} (this tree's release again)"),
        |c| c.helm()?.rollback(installed),
    )?;
    let ended = Instant::now();
    ensure!(
        upgraded.image_id != rolled_back.image_id,
        "the two revisions ran the same image {}",
        upgraded.image_id
    );

    node_by_node(&agents.events(), &nodes, began, upgraded.began)?;
    let echoes = flows
        .iter()
        .zip(echoed_before)
        .map(|(flow, before)| flow_unbroken(cluster, flow, before, ended - began))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for f in &fenced {
        fence_held(cluster, f, &witness, began)?;
        never_emptied(&quarantines.events(), f, began)?;
    }
    quarantines.check_running()?;
    eprintln!(
        "cluster tier: rollback to the previous release {} and upgrade back, 3 nodes, in {:.1?}: \
         {} flows unbroken (echoes meanwhile: {echoes:?}), 0 of the fenced holders' pings \
         delivered",
        previous.commit,
        ended - began,
        flows.len()
    );

    for f in &fenced {
        tasks::kill_running(cluster.host_of(&f.node)?, &f.stale)?;
    }
    cluster.kubectl().run(&[
        "-n",
        "default",
        "delete",
        "pods",
        "-l",
        &format!("app={APP}"),
        "--wait",
        "--timeout=90s",
    ])?;
    Ok(())
}

/// Applies `pods` (name, manifest) at once and waits until every one is Ready; their objects
/// by name.
fn run_pods(
    cluster: &mut Cluster,
    pods: &[(String, String)],
) -> anyhow::Result<BTreeMap<String, Value>> {
    let manifests: Vec<&str> = pods.iter().map(|(_, m)| m.as_str()).collect();
    cluster.kubectl().apply(&manifests.join("\n---\n"))?;
    let list = cluster.wait_for(
        &format!("{} pods Ready", pods.len()),
        Duration::from_secs(120),
        &["-n", "default", "get", "pods", "-l", &format!("app={APP}")],
        |list| {
            pods.iter().all(|(name, _)| {
                list["items"].as_array().is_some_and(|items| {
                    items
                        .iter()
                        .any(|p| p["metadata"]["name"] == name.as_str() && pod_ready(p))
                })
            })
        },
    )?;
    let items = list["items"].as_array().context("a list")?;
    Ok(items
        .iter()
        .filter_map(|p| Some((p["metadata"]["name"].as_str()?.to_owned(), p.clone())))
        .filter(|(name, _)| pods.iter().any(|(n, _)| n == name))
        .collect())
}

fn address_of(pod: &Value) -> anyhow::Result<String> {
    pod["status"]["podIP"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{} has no address", pod["metadata"]["name"]))
}

/// On every node: a pod pinging the witness, deleted (it ignores SIGTERM and lives on), its
/// address handed by host-local to a new pod on the node: ipq fences the old one. The echo
/// servers start with the stale holders.
fn fence_a_holder_on_every_node(
    cluster: &mut Cluster,
    nodes: &[String],
    witness: &Witness,
) -> anyhow::Result<Vec<Fenced>> {
    let began = Instant::now();
    let mut first = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let stale = format!("rolling-stale-{i}");
        let script = workloads::pinging(STALE[i], true);
        first.push((
            stale.clone(),
            workloads::pod_on(&stale, node, APP, 900, &script),
        ));
        let server = format!("rolling-server-{i}");
        let script = workloads::echo_server(ECHO_PORT);
        first.push((
            server.clone(),
            workloads::pod_on(&server, node, APP, 1, &script),
        ));
    }
    let running = run_pods(cluster, &first)?;
    let mut fenced = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let stale = format!("rolling-stale-{i}");
        let address = address_of(&running[&stale])?;
        fenced.push(Fenced {
            node: node.clone(),
            address,
            live: format!("rolling-live-{i}"),
            stale,
            index: i,
        });
    }
    ipq_tests::lab::poll(
        "every stale-to-be holder's pings at the witness",
        Duration::from_secs(60),
        || {
            Ok(fenced
                .iter()
                .all(|f| witness.count_sized(STALE[f.index], began) >= 2)
                .then_some(()))
        },
    )?;

    // Deleted: each starts terminating and ignores it, for 900 s of grace.
    let mut delete = vec!["-n", "default", "delete", "pod", "--wait=false"];
    delete.extend(fenced.iter().map(|f| f.stale.as_str()));
    cluster.kubectl().run(&delete)?;
    cluster.wait_for(
        "the stale holders to be terminating",
        Duration::from_secs(60),
        &["-n", "default", "get", "pods", "-l", &format!("app={APP}")],
        |list| {
            fenced.iter().all(|f| {
                list["items"].as_array().is_some_and(|items| {
                    items.iter().any(|p| {
                        p["metadata"]["name"] == f.stale.as_str()
                            && !p["metadata"]["deletionTimestamp"].is_null()
                    })
                })
            })
        },
    )?;
    // The incident: the IPAM hands the terminating pod's address to the next pod.
    let mut live = Vec::new();
    for f in &fenced {
        flannel::hand_out_again(cluster.host_of(&f.node)?, f.address.parse::<Ipv4Addr>()?)?;
        let script = workloads::pinging(LIVE[f.index], false);
        live.push((
            f.live.clone(),
            workloads::pod_on(&f.live, &f.node, APP, 1, &script),
        ));
    }
    let running = run_pods(cluster, &live)?;
    let claimed = Instant::now();
    for f in &fenced {
        let got = address_of(&running[&f.live])?;
        ensure!(
            got == f.address,
            "{} on {} got {got}, not the stale holder's {}",
            f.live,
            f.node,
            f.address
        );
        ipq_tests::lab::poll(
            &format!("ipq on {} to fence {} for {}", f.node, f.stale, f.live),
            Duration::from_secs(30),
            || {
                let view: Value = serde_json::from_str(&ipq_on(
                    cluster,
                    &f.node,
                    &["-o", "json", "get", &f.address],
                )?)?;
                Ok((view["holder"].to_string().contains(&f.live)
                    && view["fenced"].to_string().contains(&f.stale))
                .then_some(()))
            },
        )?;
    }
    ipq_tests::lab::poll(
        "every live holder's pings at the witness",
        Duration::from_secs(60),
        || {
            Ok(fenced
                .iter()
                .all(|f| witness.count_sized(LIVE[f.index], claimed) >= 3)
                .then_some(()))
        },
    )?;
    Ok(fenced)
}

/// A client on every node holding a connection to the echo server on the next node; returns
/// once every one has had echoes back.
fn open_flows(cluster: &mut Cluster, nodes: &[String]) -> anyhow::Result<Vec<Flow>> {
    let mut flows = Vec::new();
    let mut clients = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let server = format!("rolling-server-{}", (i + 1) % nodes.len());
        let server_pod = cluster
            .kubectl()
            .json(&["-n", "default", "get", "pod", &server])?;
        let server_address = address_of(&server_pod)?;
        let client = format!("rolling-client-{i}");
        let script = workloads::echo_client(&server_address, ECHO_PORT, STALL_SECS);
        clients.push((
            client.clone(),
            workloads::pod_on(&client, node, APP, 1, &script),
        ));
        flows.push(Flow {
            client,
            server_address,
        });
    }
    run_pods(cluster, &clients)?;
    ipq_tests::lab::poll("every flow's first echoes", Duration::from_secs(30), || {
        for flow in &flows {
            if echoed(cluster, &flow.client)? < 5 {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })?;
    Ok(flows)
}

/// How many lines `client`'s server has echoed back so far.
fn echoed(cluster: &Cluster, client: &str) -> anyhow::Result<u64> {
    let text =
        cluster
            .kubectl()
            .run(&["-n", "default", "exec", client, "--", "cat", ECHOED_FILE])?;
    text.trim()
        .parse()
        .with_context(|| format!("{client}'s {ECHOED_FILE}: {text:?}"))
}

/// The flow's client still runs, never restarted, and its echoes went on at one a second at
/// least (it sends about six) over `lasted`; how many came back meanwhile.
fn flow_unbroken(
    cluster: &Cluster,
    flow: &Flow,
    before: u64,
    lasted: Duration,
) -> anyhow::Result<u64> {
    let pod = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pod", &flow.client])?;
    let status = &pod["status"]["containerStatuses"][0];
    if !status["state"]["running"].is_object() || status["restartCount"] != 0 {
        let logs = cluster
            .kubectl()
            .run(&["-n", "default", "logs", &flow.client])
            .unwrap_or_else(|e| format!("{e:#}"));
        bail!(
            "the flow of {} to {} broke during the roll: {status}; its log: {}",
            flow.client,
            flow.server_address,
            logs.trim()
        );
    }
    let after = echoed(cluster, &flow.client)?;
    ensure!(
        after - before >= lasted.as_secs(),
        "the flow of {} to {}: {} echoes in {lasted:.1?}",
        flow.client,
        flow.server_address,
        after - before
    );
    Ok(after - before)
}

/// What a roll left: when it began, the image id every node's agent runs.
struct Rolled {
    began: Instant,
    image_id: String,
}

/// Runs `step` (a helm command) and waits until every node's agent is a new pod, ready, running
/// `image`, and until the recorded watch of the agents' pods has caught up with them.
fn roll(
    cluster: &mut Cluster,
    agents: &Watch,
    image: &str,
    what: &str,
    step: impl FnOnce(&Cluster) -> anyhow::Result<String>,
) -> anyhow::Result<Rolled> {
    let nodes: Vec<String> = cluster.node_names().iter().map(|n| n.to_string()).collect();
    let before = nodes
        .iter()
        .map(|n| pod_name(&agent_pod_on(cluster, n)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let began = Instant::now();
    step(cluster).with_context(|| what.to_owned())?;
    wait_rolled(cluster, &before[0]).with_context(|| format!("after {what}"))?;
    let mut after = BTreeMap::new();
    let mut image_ids = Vec::new();
    for node in &nodes {
        let pod = agent_pod_on(cluster, node)?;
        let name = pod_name(&pod)?;
        ensure!(
            !before.contains(&name),
            "after {what}: {node}'s agent is still {name}"
        );
        let spec = pod["spec"]["containers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
            .context("the agent's container")?;
        ensure!(
            spec["image"] == image,
            "after {what}: {node}'s agent runs {}, not {image}",
            spec["image"]
        );
        let status = pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "agent"))
            .context("the agent's container status")?;
        image_ids.push(status["imageID"].as_str().unwrap_or("").to_owned());
        after.insert(node.clone(), name);
    }
    image_ids.dedup();
    ensure!(
        image_ids.len() == 1 && !image_ids[0].is_empty(),
        "after {what}: the agents run the images {image_ids:?}"
    );
    agents.wait_for(
        "the recorded agents' pods to reach the rolled ones",
        Duration::from_secs(30),
        |events| {
            let mut replay = Agents::default();
            events.iter().for_each(|e| replay.apply(e));
            after
                .iter()
                .all(|(node, name)| replay.serving_on(node) == Some(name.as_str()))
        },
    )?;
    eprintln!(
        "cluster tier: {what}: every node's agent on {image} after {:.1?}",
        began.elapsed()
    );
    Ok(Rolled {
        began,
        image_id: image_ids.remove(0),
    })
}

/// The agents' pods as a replay of the recorded watch has them: name -> (node, serving: ready
/// and not being deleted).
#[derive(Default)]
struct Agents {
    pods: BTreeMap<String, (String, bool)>,
}

impl Agents {
    fn apply(&mut self, event: &Recorded) {
        let name = event.name().to_owned();
        if event.kind == "DELETED" {
            self.pods.remove(&name);
            return;
        }
        let object = &event.object;
        let node = object["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
        let serving = pod_ready(object) && object["metadata"]["deletionTimestamp"].is_null();
        self.pods.insert(name, (node, serving));
    }

    fn serving_on(&self, node: &str) -> Option<&str> {
        self.pods
            .iter()
            .find(|(_, (n, serving))| n == node && *serving)
            .map(|(name, _)| name.as_str())
    }

    fn unavailable<'n>(&self, nodes: &'n [String]) -> Vec<&'n str> {
        nodes
            .iter()
            .map(String::as_str)
            .filter(|n| self.serving_on(n).is_none())
            .collect()
    }
}

/// From the recorded watch of the agents' pods: every node had a ready agent when the rollback
/// to the previous release began; from then on never more than one node was without one; each
/// node was without one exactly once in the rollback and once in the upgrade back (which began
/// at `upgrade`), one after the other.
fn node_by_node(
    events: &[Recorded],
    nodes: &[String],
    began: Instant,
    upgrade: Instant,
) -> anyhow::Result<()> {
    let mut replay = Agents::default();
    let (before, during): (Vec<&Recorded>, Vec<&Recorded>) =
        events.iter().partition(|e| e.at < began);
    before.iter().for_each(|e| replay.apply(e));
    ensure!(
        replay.unavailable(nodes).is_empty(),
        "when the rollback began, the recorded watch had no ready agent on {:?}",
        replay.unavailable(nodes)
    );
    // (node, without a ready agent from, until)
    let mut spans: Vec<(&str, Instant, Instant)> = Vec::new();
    let mut open: BTreeMap<&str, Instant> = BTreeMap::new();
    for event in during {
        replay.apply(event);
        let down = replay.unavailable(nodes);
        ensure!(
            down.len() <= 1,
            "{:?} had no ready agent at once (event {} of {}), the DaemonSet's maxUnavailable \
             is 1",
            down,
            event.kind,
            event.name()
        );
        for node in &down {
            open.entry(node).or_insert(event.at);
        }
        let back: Vec<&str> = open.keys().copied().filter(|n| !down.contains(n)).collect();
        for node in back {
            let from = open.remove(node).context("open")?;
            spans.push((node, from, event.at));
        }
    }
    ensure!(open.is_empty(), "{open:?} never got a ready agent back");
    let report: Vec<String> = spans
        .iter()
        .map(|(node, from, until)| format!("{node} {:.1?}", *until - *from))
        .collect();
    eprintln!(
        "cluster tier: nodes without a ready agent, in turn: {}",
        report.join(", ")
    );
    for (roll, spans) in [
        (
            "rollback to the previous release",
            spans.iter().filter(|s| s.1 < upgrade).collect::<Vec<_>>(),
        ),
        (
            "upgrade back",
            spans.iter().filter(|s| s.1 >= upgrade).collect(),
        ),
    ] {
        let mut rolled: Vec<&str> = spans.iter().map(|s| s.0).collect();
        rolled.sort_unstable();
        let mut expected: Vec<&str> = nodes.iter().map(String::as_str).collect();
        expected.sort_unstable();
        ensure!(
            rolled == expected,
            "the {roll} took the agents of {rolled:?} down, not each node's once"
        );
    }
    Ok(())
}

/// The fence held throughout: the stale holder still runs, ipq still has it fenced behind the
/// live holder, and none of its pings reached the witness since the roll began, while the
/// live holder's went on.
fn fence_held(
    cluster: &Cluster,
    f: &Fenced,
    witness: &Witness,
    began: Instant,
) -> anyhow::Result<()> {
    tasks::ensure_running(cluster.host_of(&f.node)?, &f.stale, "after the rollback")?;
    let view: Value = serde_json::from_str(&ipq_on(
        cluster,
        &f.node,
        &["-o", "json", "get", &f.address],
    )?)?;
    ensure!(
        view["holder"].to_string().contains(&f.live)
            && view["fenced"].to_string().contains(&f.stale),
        "after the rollback, ipq get {} on {}: {view}",
        f.address,
        f.node
    );
    let leaked = witness.count_sized(STALE[f.index], began);
    ensure!(
        leaked == 0,
        "{leaked} of the fenced {}'s pings on {} reached the witness during the roll",
        f.stale,
        f.node
    );
    let live = witness.count_sized(LIVE[f.index], began);
    let lasted = began.elapsed().as_secs() as usize;
    ensure!(
        live >= lasted,
        "{}'s pings at the witness during the roll: {live} in {lasted} s",
        f.live
    );
    Ok(())
}

fn lists_fenced(object: &Value, f: &Fenced) -> bool {
    object["status"]["entries"]
        .as_array()
        .is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e["address"] == f.address.as_str() && e["state"] == "fenced")
        })
}

/// The index of the first recorded event of `f`'s node's NodeQuarantine that lists it fenced.
fn first_listing(events: &[Recorded], f: &Fenced) -> Option<usize> {
    events
        .iter()
        .position(|e| e.name() == f.node && lists_fenced(&e.object, f))
}

/// Every version of `f`'s node's NodeQuarantine recorded from the first that listed `f` fenced
/// (before the roll began) on lists it, and none deleted the object.
fn never_emptied(events: &[Recorded], f: &Fenced, began: Instant) -> anyhow::Result<()> {
    let first = first_listing(events, f).with_context(|| {
        format!(
            "{}'s NodeQuarantine never listed {} fenced",
            f.node, f.address
        )
    })?;
    ensure!(
        events[first].at < began,
        "{}'s NodeQuarantine listed {} only after the roll began",
        f.node,
        f.address
    );
    let mut versions = 0;
    for event in events[first..].iter().filter(|e| e.name() == f.node) {
        ensure!(
            event.kind != "DELETED" && lists_fenced(&event.object, f),
            "{}'s NodeQuarantine ({} at resourceVersion {}) dropped the fenced {} while its \
             holder {} lived: {}",
            f.node,
            event.kind,
            event.object["metadata"]["resourceVersion"],
            f.address,
            f.stale,
            event.object["status"]
        );
        versions += 1;
    }
    eprintln!(
        "cluster tier: {}'s NodeQuarantine: {versions} versions recorded, each listing {} fenced",
        f.node, f.address
    );
    Ok(())
}
