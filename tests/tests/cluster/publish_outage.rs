//! The NodeQuarantine publisher (#37) across an outage of the API server: kube-apiserver
//! stopped for 60 s while the node's quarantine changes. The writer's backoff has grown to
//! tens of seconds by then; the agent notices the API server's return (its probe of `/readyz`,
//! any call that succeeds) and writes within a second of it.
//!
//! A control plane of the tier's own without its node ([`ApiServer`]), the agent in a lab,
//! driven by the lab's routes (an early reuse fences the old holder: a listed change).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    cluster::api_server::ApiServer,
    lab::{
        ifindex, map_entry, pod_a_and_peer, pod_a_traffic, poll, wait_for_entry, Lab, POD_B_LLADDR,
    },
};
use serde_json::Value;

const NODE: &str = "ipq-lab-node";
const SETTLE: Duration = Duration::from_secs(10);
/// How long kube-apiserver is down.
const OUTAGE: Duration = Duration::from_secs(60);
/// What the agent promises: the write within 1 s of the API server's return.
const CATCH_UP: Duration = Duration::from_secs(1);
/// Stated margin on top: the write's own round trip on a loaded 2-core machine, and the
/// test's view of the return (the start of the `/readyz` probe that saw it ready; the one
/// before it, 20 ms and a kubectl run earlier, did not).
const MARGIN: Duration = Duration::from_millis(500);

fn fenced(object: &Value, addr: std::net::IpAddr) -> bool {
    object["status"]["entries"]
        .as_array()
        .is_some_and(|entries| {
            entries
                .iter()
                .any(|e| e["address"] == addr.to_string() && e["state"] == "fenced")
        })
}

/// Injected: kube-apiserver killed for 60 s; during it an early reuse fences pod a's old
/// holder. Holds: the fence is enforced throughout (0/20), the failed writes counted as
/// `unreachable`, and once the API server answers `/readyz` again the object lists the fenced
/// address with a `publishedAt` within 1 s (+ 0.5 s margin) of that moment.
#[test]
fn after_an_api_server_outage_the_object_is_written_within_a_second_of_its_return(
) -> anyhow::Result<()> {
    let mut api = ApiServer::start(NODE)?;
    let lab = Lab::new()?;
    api.reachable_from(&lab.node)?;
    let kubeconfig = lab.work_dir().join("kubeconfig");
    api.agent_kubeconfig(&kubeconfig, Duration::from_secs(3600))?;
    let mut watch = api.watch_node_quarantine()?;
    let agent = lab.start_publishing_agent(NODE, &kubeconfig, &[])?;
    watch
        .wait_for("the agent's first write", SETTLE, |o| {
            o["status"]["publishedAt"].is_string()
        })
        .with_context(|| format!("agent log:\n{}\n{}", agent.log(), api.logs()))?;
    drop(watch);

    api.stop_apiserver();
    let outage_began = Instant::now();
    let vethpa = ifindex(&lab.node, "vethpa")?;
    let vethpb = ifindex(&lab.node, "vethpb")?;
    let (addr, peer) = pod_a_and_peer()[0];
    lab.routes().route_by_oif("vethpa", 101, &[addr])?;
    wait_for_entry(&lab, addr, &map_entry("active", vethpa, 0), SETTLE);
    lab.routes().del_host_route("vethpa", addr)?;
    wait_for_entry(&lab, addr, &map_entry("draining", vethpa, 0), SETTLE);
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
    lab.routes().add_host_route("vethpb", addr, None)?;
    wait_for_entry(&lab, addr, &map_entry("active", vethpb, vethpa), SETTLE);
    ensure!(
        pod_a_traffic(&lab, addr, peer, 20) == (0, 0),
        "{addr}: the fenced old holder's traffic passed while the API server was down"
    );
    let unreachable = |agent: &ipq_tests::lab::Agent| {
        agent.metric("ipq_publish_failures_total", &[("reason", "unreachable")])
    };
    poll("a write failing as unreachable", SETTLE, || {
        Ok((unreachable(&agent)? >= 1.0).then_some(()))
    })?;
    // The outage's length is the injected condition (the writer's backoff grows through it),
    // not a wait for an event.
    std::thread::sleep(OUTAGE.saturating_sub(outage_began.elapsed()));
    let failed_writes = unreachable(&agent)?;

    let ready_at = api.start_apiserver()?;
    let object = poll("the fenced address listed", Duration::from_secs(60), || {
        let object = api.kubectl().json(&["get", "nodequarantines", NODE])?;
        Ok(fenced(&object, addr).then_some(object))
    })
    .with_context(|| format!("agent log:\n{}", agent.log()))?;
    let published_at: SystemTime = humantime::parse_rfc3339(
        object["status"]["publishedAt"]
            .as_str()
            .context("publishedAt")?,
    )?;
    let after = published_at
        .duration_since(ready_at)
        .unwrap_or(Duration::ZERO);
    eprintln!(
        "publish outage: {failed_writes} writes failed in {OUTAGE:?}; written {after:.3?} after \
         the API server answered /readyz again"
    );
    ensure!(
        after <= CATCH_UP + MARGIN,
        "the object was written {after:?} after the API server's return (bound {CATCH_UP:?} + \
         {MARGIN:?})\nagent log:\n{}",
        agent.log()
    );
    ensure!(
        agent.log().contains("the API server answers again"),
        "the return is logged:\n{}",
        agent.log()
    );
    ensure!(
        pod_a_traffic(&lab, addr, peer, 20) == (0, 0),
        "{addr}: the fence went with the catch-up"
    );
    // Not `api.check_running()`: kube-controller-manager exits when the API server goes away
    // while it initializes (this outage begins seconds after the start), and nothing here
    // needs it.
    Ok(())
}
