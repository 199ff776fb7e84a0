//! `kubectl rollout restart daemonset/ipq-agent` while pods churn: bare pods are created and
//! deleted without pause while the DaemonSet replaces the agent, and no CNI DEL is lost: those
//! the old agent answered, and those `ipq-cni` spooled while no agent ran, which the new one
//! replays at its start.
//!
//! What proves that a DEL reached ipq: it drains the pod's address (active to draining) before
//! the bridge plugin deletes the pod's interface. A pod whose DEL was lost would go from active
//! straight to quarantined when netlink (or the new agent's first dump) finds its interface
//! gone, and its address would end the same way; only the transitions tell them apart. So the
//! test follows both agents' event feeds (`ipq -o json events --follow` through `kubectl
//! exec`), checks that neither lost an event, and finds for every deleted pod that had an
//! address the `draining` transition with that pod as its holder.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    net::IpAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq_tests::cluster::{
    daemon::Daemon,
    deploy::{self, ipq, AGENT_SELECTOR, NAMESPACE},
    kubectl::pod_ready,
    node::{self, HOST_LOCAL_DIR, POD_ADDRESS},
    workloads::churn_pods,
    Cluster,
};
use serde_json::Value;

use super::{Rollout, OLD};

/// Churn pods alive at a time.
const POPULATION: usize = 6;
/// Pods with an address deleted per round once the old agent is going.
const DELETED_PER_ROUND: usize = 2;
/// Rounds of churn once the new agent serves, and pods with an address it must see deleted.
const ROUNDS_UNDER_THE_NEW_AGENT: u32 = 3;
const DELETED_UNDER_THE_NEW_AGENT: usize = 2;

/// The churn: every pod it made, in order, with its address once the API showed one.
#[derive(Default)]
struct Churn {
    made: usize,
    /// Created and not deleted yet, oldest first.
    live: Vec<ChurnPod>,
    deleted: Vec<ChurnPod>,
}

struct ChurnPod {
    name: String,
    address: Option<IpAddr>,
}

impl Churn {
    /// Creates pods until `POPULATION` are alive (one `kubectl apply`).
    fn top_up(&mut self, cluster: &Cluster) -> anyhow::Result<()> {
        let missing = POPULATION.saturating_sub(self.live.len());
        if missing == 0 {
            return Ok(());
        }
        let names: Vec<String> = (0..missing)
            .map(|_| {
                self.made += 1;
                format!("churn-{:03}", self.made)
            })
            .collect();
        cluster.kubectl().apply(&churn_pods(&names))?;
        self.live.extend(names.into_iter().map(|name| ChurnPod {
            name,
            address: None,
        }));
        Ok(())
    }

    /// Records the addresses the API shows for the live pods.
    fn observe(&mut self, cluster: &Cluster) -> anyhow::Result<()> {
        let pods = churn_pods_in_api(cluster)?;
        for pod in &mut self.live {
            let shown = pods
                .iter()
                .find(|p| p["metadata"]["name"] == pod.name.as_str())
                .and_then(|p| p["status"]["podIP"].as_str());
            if let Some(ip) = shown {
                pod.address = Some(
                    ip.parse()
                        .with_context(|| format!("{}'s podIP", pod.name))?,
                );
            }
        }
        Ok(())
    }

    /// Deletes up to `count` of the oldest live pods that have an address; how many.
    fn delete_addressed(&mut self, cluster: &Cluster, count: usize) -> anyhow::Result<usize> {
        let chosen: Vec<String> = self
            .live
            .iter()
            .filter(|p| p.address.is_some())
            .take(count)
            .map(|p| p.name.clone())
            .collect();
        self.delete(cluster, &chosen)?;
        Ok(chosen.len())
    }

    /// Deletes every live pod.
    fn delete_all(&mut self, cluster: &Cluster) -> anyhow::Result<()> {
        let all: Vec<String> = self.live.iter().map(|p| p.name.clone()).collect();
        self.delete(cluster, &all)
    }

    fn delete(&mut self, cluster: &Cluster, names: &[String]) -> anyhow::Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let mut args = vec!["-n", "default", "delete", "pod", "--wait=false"];
        args.extend(names.iter().map(String::as_str));
        cluster.kubectl().run(&args)?;
        let (gone, kept) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|p| names.contains(&p.name));
        self.live = kept;
        self.deleted.extend::<Vec<ChurnPod>>(gone);
        Ok(())
    }
}

fn churn_pods_in_api(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    let pods = cluster
        .kubectl()
        .json(&["-n", "default", "get", "pods", "-l", "app=churn"])?;
    Ok(pods["items"].as_array().cloned().unwrap_or_default())
}

/// Where the DaemonSet's rollout is, as the churn sees it each round.
#[derive(Clone, Copy, Debug, PartialEq)]
enum AgentPhase {
    /// The agent that was there before the restart still serves.
    Old,
    /// It is terminating or gone, and no new one is ready.
    Away,
    /// Only a new agent is there, and it is ready.
    New,
}

fn agent_phase(cluster: &Cluster, old: &str) -> anyhow::Result<AgentPhase> {
    let pods = cluster
        .kubectl()
        .json(&["-n", NAMESPACE, "get", "pods", "-l", AGENT_SELECTOR])?;
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let serving = |p: &Value| pod_ready(p) && p["metadata"]["deletionTimestamp"].is_null();
    let is_old = |p: &Value| p["metadata"]["name"] == old;
    Ok(if items.iter().any(|p| is_old(p) && serving(p)) {
        AgentPhase::Old
    } else if !items.iter().any(is_old) && items.iter().any(|p| !is_old(p) && serving(p)) {
        AgentPhase::New
    } else {
        AgentPhase::Away
    })
}

/// `ipq -o json events --follow` through `kubectl exec`, run beside the test until the agent
/// it reached ends (or the test drops it); its lines in `<name>.log` in the node's directory.
struct EventFeed {
    name: String,
    log: PathBuf,
    _follower: Daemon,
}

impl EventFeed {
    /// Starts following the agent that serves now; returns once its first event arrived.
    fn follow(cluster: &Cluster, name: &str) -> anyhow::Result<EventFeed> {
        let cmd = cluster.kubectl().command(&[
            "-n",
            NAMESPACE,
            "exec",
            "ds/ipq-agent",
            "-c",
            "agent",
            "--",
            "ipq",
            "-o",
            "json",
            "events",
            "--follow",
        ]);
        let feed = EventFeed {
            name: name.to_owned(),
            log: cluster.host.dir().join(format!("{name}.log")),
            _follower: Daemon::spawn(name, cmd, cluster.host.dir())?,
        };
        ipq_tests::lab::poll(
            &format!("the first event of {name}"),
            Duration::from_secs(60),
            || Ok((!feed.events()?.is_empty()).then_some(())),
        )?;
        Ok(feed)
    }

    /// The events so far (the log's other lines are kubectl's).
    fn events(&self) -> anyhow::Result<Vec<Value>> {
        let text = fs::read_to_string(&self.log)
            .with_context(|| format!("reading {}", self.log.display()))?;
        Ok(text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| event["seq"].is_u64())
            .collect())
    }

    /// The events, checked to be complete from `first_seq` on: no `lost` marker, no gap.
    fn complete_events(&self, first_seq: Option<u64>) -> anyhow::Result<Vec<Value>> {
        let events = self.events()?;
        let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
        ensure!(
            !events.iter().any(|e| e["type"] == "lost"),
            "{} lost events: {:?}",
            self.name,
            events
                .iter()
                .filter(|e| e["type"] == "lost")
                .collect::<Vec<_>>()
        );
        if let (Some(first), Some(seen)) = (first_seq, seqs.first()) {
            ensure!(
                *seen == first,
                "{} begins at event {seen}, not {first}: its backlog no longer held the agent's \
                 first events",
                self.name
            );
        }
        let gap = seqs.windows(2).find(|pair| pair[1] != pair[0] + 1);
        ensure!(
            gap.is_none(),
            "{} has a gap in its events: {gap:?}",
            self.name
        );
        Ok(events)
    }
}

/// Across `kubectl rollout restart daemonset/ipq-agent`, pods are created and deleted without
/// pause (the deletions of pods with an address begin once the old agent is seen going, so that
/// some DELs fall while no agent runs); then every churn pod is deleted. Afterwards: no pod is
/// stuck terminating; every deleted pod that had an address had it drained by its DEL (in one
/// agent's feed or the other); the new agent replayed spooled DELs; nothing is held in ipq for
/// a pod that is gone, and every live pod's address is held in ipq by that pod; host-local's
/// directory holds exactly the live pods' addresses; the fenced old sender reached nobody
/// during it (0 fenced packets delivered across the restart).
pub fn agent_restart_while_pods_churn(
    cluster: &mut Cluster,
    rollout: &Rollout,
) -> anyhow::Result<()> {
    let began = Instant::now();
    node::open_range(&cluster.host)?;
    let old_agent = deploy::agent_pod(cluster)?["metadata"]["name"]
        .as_str()
        .context("the agent pod's name")?
        .to_owned();
    let old_feed = EventFeed::follow(cluster, "events-old-agent")?;

    let mut churn = Churn::default();
    churn.top_up(cluster)?;
    cluster.wait_for(
        "the first churn pods to run",
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=churn"],
        |pods| {
            pods["items"].as_array().is_some_and(|items| {
                items.len() == POPULATION
                    && items
                        .iter()
                        .all(|p| pod_ready(p) && p["status"]["podIP"].is_string())
            })
        },
    )?;

    cluster
        .kubectl()
        .run(&["-n", NAMESPACE, "rollout", "restart", "daemonset/ipq-agent"])?;
    let mut old_going = false;
    let mut rounds_under_new = 0;
    let mut deleted_under_new = 0;
    let mut new_feed = None;
    ipq_tests::lab::poll(
        "the agent to be replaced while pods churn",
        Duration::from_secs(300),
        || {
            let phase = agent_phase(cluster, &old_agent)?;
            churn.observe(cluster)?;
            old_going |= phase != AgentPhase::Old;
            if phase == AgentPhase::New && new_feed.is_none() {
                // At once, so that its backlog still holds the agent's first events (the
                // replayed DELs among them).
                new_feed = Some(EventFeed::follow(cluster, "events-new-agent")?);
            }
            if old_going {
                let deleted = churn.delete_addressed(cluster, DELETED_PER_ROUND)?;
                if phase == AgentPhase::New {
                    rounds_under_new += 1;
                    deleted_under_new += deleted;
                }
            }
            churn.top_up(cluster)?;
            Ok((rounds_under_new >= ROUNDS_UNDER_THE_NEW_AGENT
                && deleted_under_new >= DELETED_UNDER_THE_NEW_AGENT)
                .then_some(()))
        },
    )
    .with_context(|| {
        format!(
            "{} churn pods made, {} deleted, the old agent going: {old_going}, rounds under \
             the new agent: {rounds_under_new}",
            churn.made,
            churn.deleted.len()
        )
    })?;
    deploy::wait_daemonset_ready(cluster)?;
    let new_feed = new_feed.context("the new agent's feed")?;
    churn.observe(cluster)?;
    churn.delete_all(cluster)?;
    cluster.wait_for(
        "every churn pod to be gone (none stuck terminating)",
        Duration::from_secs(180),
        &["-n", "default", "get", "pods", "-l", "app=churn"],
        |pods| pods["items"].as_array().is_some_and(Vec::is_empty),
    )?;
    eprintln!(
        "cluster tier: churn: {} pods made and deleted, {} of them with an address",
        churn.deleted.len(),
        churn.deleted.iter().filter(|p| p.address.is_some()).count()
    );

    every_del_drained(&churn, &old_feed, &new_feed)?;
    spooled_dels_replayed(cluster)?;
    ipq_holds_exactly_the_live_pods(cluster)?;

    let address: IpAddr = POD_ADDRESS.parse()?;
    let leaked = rollout.witness.count(address, OLD, began);
    ensure!(
        leaked == 0,
        "{leaked} of the fenced pod's pings reached the peer across the restart under churn"
    );
    Ok(())
}

/// Every deleted pod that had an address: its DEL drained it (active to draining, the pod as
/// holder) in the old agent's feed or the new one's, both complete.
fn every_del_drained(churn: &Churn, old: &EventFeed, new: &EventFeed) -> anyhow::Result<()> {
    let mut events = old.complete_events(None)?;
    events.extend(new.complete_events(Some(1))?);
    let drained: BTreeSet<(String, String)> = events
        .iter()
        .filter(|e| e["type"] == "transition" && e["to"] == "draining")
        .filter_map(|e| {
            Some((
                e["address"].as_str()?.to_owned(),
                e["holder"]["pod"]["name"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let lost: Vec<String> = churn
        .deleted
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.address?)))
        .filter(|(name, address)| !drained.contains(&(address.to_string(), name.clone())))
        .map(|(name, address)| format!("{name} ({address})"))
        .collect();
    ensure!(
        lost.is_empty(),
        "the CNI DEL of {} deleted pods never drained their address in ipq: {}",
        lost.len(),
        lost.join(", ")
    );
    Ok(())
}

/// The new agent replayed at least one spooled DEL that drained an address: the churn did
/// delete a pod while no agent ran, so the spool was on the path.
fn spooled_dels_replayed(cluster: &Cluster) -> anyhow::Result<()> {
    let logs = cluster
        .kubectl()
        .run(&["-n", NAMESPACE, "logs", "ds/ipq-agent", "-c", "agent"])?;
    let replayed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("CNI spool: replayed the DEL"))
        .collect();
    let drained = replayed
        .iter()
        .filter(|l| !l.contains("(0 addresses drained)"))
        .count();
    eprintln!(
        "cluster tier: churn: the new agent replayed {} spooled DELs, {drained} of them \
         draining an address",
        replayed.len()
    );
    ensure!(
        drained >= 1,
        "the new agent replayed no spooled DEL of a pod with an address ({} replayed): no pod \
         was deleted while no agent ran",
        replayed.len()
    );
    Ok(())
}

/// Every live pod on the pod network has its address held in ipq by itself; nothing active or
/// draining in ipq is held for a pod that is not live; host-local's directory holds exactly the
/// live pods' addresses.
fn ipq_holds_exactly_the_live_pods(cluster: &Cluster) -> anyhow::Result<()> {
    let pods = cluster.kubectl().json(&["get", "pods", "-A"])?;
    let live: BTreeMap<String, String> = pods["items"]
        .as_array()
        .context("pods")?
        .iter()
        .filter(|p| p["spec"]["hostNetwork"] != true)
        .filter_map(|p| {
            Some((
                p["status"]["podIP"].as_str()?.to_owned(),
                p["metadata"]["name"].as_str()?.to_owned(),
            ))
        })
        .collect();
    let listed: Value = serde_json::from_str(&ipq(cluster, &["-o", "json", "list"])?)?;
    let listed = listed["addresses"].as_array().context("ipq list")?;
    let holder_of = |address: &str| {
        listed
            .iter()
            .find(|a| a["address"] == address)
            .filter(|a| a["state"] == "active")
            .and_then(|a| a["holder"]["pod"]["name"].as_str())
    };
    for (address, pod) in &live {
        ensure!(
            holder_of(address) == Some(pod.as_str()),
            "the live pod {pod}'s address {address} is not held by it in ipq: {:?}",
            listed.iter().find(|a| a["address"] == address.as_str())
        );
    }
    let held_for_gone: Vec<&Value> = listed
        .iter()
        .filter(|a| a["state"] == "active" || a["state"] == "draining")
        .filter(|a| {
            let pod = a["holder"]["pod"]["name"].as_str().unwrap_or_default();
            !live.values().any(|name| name == pod)
        })
        .collect();
    ensure!(
        held_for_gone.is_empty(),
        "ipq holds addresses for pods that are gone: {held_for_gone:?}"
    );

    let files = ipq_tests::netns::output_of(cluster.host.command("ls").arg(HOST_LOCAL_DIR))?;
    let reserved: BTreeSet<String> = files
        .split_whitespace()
        .filter(|f| f.parse::<IpAddr>().is_ok())
        .map(str::to_owned)
        .collect();
    let wanted: BTreeSet<String> = live.keys().cloned().collect();
    ensure!(
        reserved == wanted,
        "host-local's reservations {reserved:?} are not the live pods' addresses {wanted:?} \
         (leaked: {:?})",
        reserved.difference(&wanted).collect::<Vec<_>>()
    );
    Ok(())
}
