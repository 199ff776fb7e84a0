//! Observability of the real agent (issue 5), checked with the real Prometheus tools:
//!
//! - every labelled family has all its series at the first scrape (a series appearing only
//!   later breaks `rate()` and alerts), `ipq_events_lost_total` among them with kernel, log
//!   and api;
//! - `promtool check metrics` passes, without a single lint remark, on `/metrics` after an
//!   incident gave counters and both histograms data;
//! - a Prometheus server scraping the agent sees exactly the conflicts an incident caused, the
//!   same values as the agent's own `/metrics`.
//!
//! Needs root, bpffs, `target/debug/ipq-agent` and the Debian package `prometheus`
//! (`promtool`, `prometheus`); `cargo xtask setup` and `cargo xtask test` provide them.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use ipq_tests::{
    lab::{
        map_entry as entry, pod_a_and_peer, poll, udp_burst, udp_burst_with, wait_claimed_at_start,
        wait_for_entry, Agent, Lab, Scrape, UdpSender, METRICS_ADDR, PEER_V4, POD_A_V4, POD_A_V6,
        POD_B_LLADDR,
    },
    prometheus::{promtool_check_metrics, Prometheus},
};

/// Datagrams per burst.
const N: usize = 20;
/// How long the agent may take to act on a netlink event.
const SETTLE: Duration = Duration::from_secs(5);
/// How long Prometheus may take to scrape what the agent shows (1 s scrape interval).
const SCRAPED: Duration = Duration::from_secs(15);
/// Where the test's Prometheus listens, inside the node namespace (no clash with the host).
const PROMETHEUS_LISTEN: &str = "127.0.0.1:19090";
const JOB: &str = "ipq";

const CONFLICT_KINDS: [&str; 4] = [
    "early_reuse",
    "reuse_in_cooldown",
    "duplicate_source",
    "remote_claim",
];

/// The label sets (as "k=v,k=v") of every series of `name` in a scrape.
fn label_sets(scrape: &Scrape, name: &str) -> BTreeSet<String> {
    scrape
        .0
        .iter()
        .filter(|s| s.name == name)
        .map(|s| {
            s.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

fn set<const K: usize>(items: [&str; K]) -> BTreeSet<String> {
    items.into_iter().map(str::to_owned).collect()
}

/// The agent's `ipq_conflicts_total`, by kind.
fn agent_conflicts(agent: &Agent) -> BTreeMap<String, f64> {
    let scrape = agent.scrape().expect("scrape");
    CONFLICT_KINDS
        .iter()
        .map(|kind| {
            let value = scrape
                .get("ipq_conflicts_total", &[("kind", kind)])
                .unwrap_or_else(|e| panic!("{e:#}"));
            ((*kind).to_owned(), value)
        })
        .collect()
}

fn conflicts(pairs: [(&str, f64); 4]) -> BTreeMap<String, f64> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Runs `promtool check metrics` on the agent's `/metrics` and asserts it is spotless.
fn assert_promtool_clean(agent: &Agent, when: &str) -> Scrape {
    let text = agent.metrics().expect("/metrics");
    let verdict = promtool_check_metrics(&text).expect("running promtool");
    assert!(
        verdict.passed && verdict.output.trim().is_empty(),
        "promtool check metrics {when}: passed = {}, said:\n{}\n--- /metrics ---\n{text}",
        verdict.passed,
        verdict.output
    );
    Scrape::parse(&text).expect("parsing /metrics")
}

/// promtool must be able to fail, or a clean verdict proves nothing: a counter without
/// `_total` and a metric without HELP are what it exists to catch.
#[test]
fn promtool_rejects_an_exposition_that_breaks_the_conventions() {
    let bad = "# TYPE ipq_conflicts counter\nipq_conflicts{kind=\"early_reuse\"} 1\n";
    let verdict = promtool_check_metrics(bad).expect("running promtool");
    assert!(
        !verdict.passed && verdict.output.contains("_total"),
        "promtool accepted a counter without _total and HELP: {verdict:?}"
    );
}

/// The first scrape of a fresh agent has every series; after an early reuse under
/// `fence-old`, a pod gone and stale traffic for its quarantined address (so conflicts,
/// drops, and both histograms have data), `/metrics` still passes `promtool check metrics`
/// without a remark.
#[test]
fn agent_metrics_have_every_series_from_the_first_scrape_and_pass_promtool_after_an_incident() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&[
            "--workload",
            "vethp*",
            "--uplink",
            "up0",
            "--on-early-reuse",
            "fence-old",
            "--cooldown",
            "1s",
            "--quiet-period",
            "1s",
            "--max-cooldown",
            "10s",
        ])
        .expect("starting ipq-agent");

    // The very first scrape, before the agent saw anything happen.
    let first = assert_promtool_clean(&agent, "on the first scrape");
    let hooks = set(["hook=tc_egress", "hook=tc_ingress", "hook=xdp"]);
    let hook_reasons: BTreeSet<String> = hooks
        .iter()
        .flat_map(|h| {
            [
                "fenced",
                "duplicate_source",
                "stale_traffic",
                "quarantined",
                "remote_claim",
            ]
            .map(|r| format!("{h},reason={r}"))
        })
        .collect();
    for family in ["dropped", "observed", "reported"] {
        for unit in ["packets", "bytes"] {
            let name = format!("ipq_{family}_{unit}_total");
            assert_eq!(label_sets(&first, &name), hook_reasons, "{name}");
        }
    }
    for (name, want) in [
        (
            "ipq_events_lost_total",
            set(["source=api", "source=kernel", "source=log", "source=queue"]),
        ),
        (
            "ipq_conflicts_total",
            CONFLICT_KINDS.iter().map(|k| format!("kind={k}")).collect(),
        ),
        (
            "ipq_addresses",
            set(["state=active", "state=draining", "state=quarantined"]),
        ),
        ("ipq_datapath_interfaces", hooks.clone()),
        ("ipq_ready", set([""])),
        (
            "ipq_datapath_write_failures_total",
            set(["op=delete", "op=update"]),
        ),
        ("ipq_datapath_writes_pending", set([""])),
        ("ipq_datapath_bpf_watcher_stops_total", set([""])),
        ("ipq_datapath_bpf_watcher_lost_calls_total", set([""])),
        (
            "ipq_queue_overflows_total",
            set([
                "queue=attach_reports",
                "queue=hygiene_jobs",
                "queue=hygiene_reports",
                "queue=journal_commits",
                "queue=map_writes",
                "queue=netlink_events",
                "queue=reported_keys",
                "queue=tc_notices",
            ]),
        ),
        ("ipq_stale_traffic_age_seconds_count", set([""])),
        ("ipq_quarantine_duration_seconds_count", set([""])),
    ] {
        assert_eq!(label_sets(&first, name), want, "{name} on the first scrape");
    }
    assert_eq!(first.get("ipq_ready", &[]).unwrap(), 1.0, "ready");

    // SwarmKit #2407: pod a terminates, its IPv4 address goes to pod b at once.
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);
    let reused = IpAddr::from(POD_A_V4);
    lab.routes()
        .del_host_route("vethpa", reused)
        .expect("withdrawing");
    wait_for_entry(&lab, reused, &entry("draining", vethpa, 0), SETTLE);
    lab.routes()
        .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, reused)
        .expect("giving pod b the address");
    lab.routes()
        .add_host_route("vethpb", reused, None)
        .expect("pod b's host route");
    wait_for_entry(&lab, reused, &entry("active", vethpb, vethpa), SETTLE);
    let sender = UdpSender {
        bind: Some(reused),
        device: None,
    };
    assert_eq!(
        udp_burst_with(&lab.pod_a, sender, &lab.peer, PEER_V4.into(), N),
        0,
        "the fenced old pod gets nothing through"
    );

    // Pod a is gone: fd77::2 is quarantined, and the peer's traffic for it is stale.
    lab.node
        .ip(&["link", "del", "vethpa"])
        .expect("deleting vethpa");
    let quarantined = IpAddr::from(POD_A_V6);
    wait_for_entry(&lab, quarantined, &entry("quarantined", 0, 0), SETTLE);
    assert_eq!(
        udp_burst(&lab.peer, &lab.pod_a, quarantined, N),
        0,
        "stale traffic is dropped at the uplink"
    );
    // Released after its cool-down and a quiet period without stale traffic.
    lab.maps()
        .wait_entry(quarantined, SETTLE, "released", |e| e.is_none())
        .unwrap_or_else(|e| panic!("{e:#}"));
    let after = poll("both histograms to have data", SETTLE, || {
        let scrape = agent.scrape()?;
        let count = |name: &str| scrape.get(&format!("{name}_count"), &[]);
        Ok((count("ipq_stale_traffic_age_seconds")? >= 1.0
            && count("ipq_quarantine_duration_seconds")? >= 1.0)
            .then_some(scrape))
    })
    .unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", agent.log()));
    assert_eq!(
        after
            .get("ipq_conflicts_total", &[("kind", "early_reuse")])
            .unwrap(),
        1.0
    );
    assert_eq!(
        after
            .get(
                "ipq_dropped_packets_total",
                &[("hook", "tc_ingress"), ("reason", "fenced")]
            )
            .unwrap(),
        N as f64
    );
    assert!(
        after
            .get(
                "ipq_dropped_packets_total",
                &[("hook", "xdp"), ("reason", "stale_traffic")]
            )
            .unwrap()
            >= N as f64
    );

    assert_promtool_clean(&agent, "after the incident");
}

/// A Prometheus server in the node namespace scrapes the agent every second while the
/// whereabouts incident is replayed under `fence-old`: pod b is handed pod a's addresses and
/// sends with them (a duplicate source per address), then its host routes appear (an early
/// reuse per address). Prometheus's `ipq_conflicts_total`, queried over its HTTP API, equals
/// per kind both what the test caused and what the agent's own `/metrics` says; the dropped
/// packets of the duplicate sources arrive too.
#[test]
fn a_prometheus_server_scraping_the_agent_sees_exactly_the_conflicts_the_incident_caused() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&[
            "--workload",
            "vethp*",
            "--uplink",
            "up0",
            "--on-early-reuse",
            "fence-old",
        ])
        .expect("starting ipq-agent");
    let prometheus = Prometheus::start(&lab.node, PROMETHEUS_LISTEN, JOB, METRICS_ADDR)
        .expect("starting prometheus");
    let (vethpa, vethpb) = wait_claimed_at_start(&lab, SETTLE);

    // Before anything happens, Prometheus already has every kind, at 0, and every source of
    // lost events: there is a first point for rate() and alerts to start from.
    let by_label = |query: &str, label: &str| -> anyhow::Result<BTreeMap<String, f64>> {
        Ok(prometheus
            .query(query)?
            .into_iter()
            .map(|s| (s.labels.get(label).cloned().unwrap_or_default(), s.value))
            .collect())
    };
    let up = format!("up{{job=\"{JOB}\"}}");
    poll("Prometheus to scrape the agent", SCRAPED, || {
        Ok((by_label(&up, "job")?.get(JOB) == Some(&1.0)).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\nprometheus log:\n{}", prometheus.log()));
    assert_eq!(
        by_label("ipq_conflicts_total", "kind").expect("query"),
        conflicts([
            ("early_reuse", 0.0),
            ("reuse_in_cooldown", 0.0),
            ("duplicate_source", 0.0),
            ("remote_claim", 0.0),
        ]),
        "Prometheus's ipq_conflicts_total before the incident"
    );
    assert_eq!(
        by_label("ipq_events_lost_total", "source")
            .expect("query")
            .into_keys()
            .collect::<BTreeSet<_>>(),
        set(["api", "kernel", "log", "queue"]),
        "Prometheus's ipq_events_lost_total sources"
    );
    assert_eq!(
        by_label("ipq_ready", "job").expect("query"),
        BTreeMap::from([(JOB.to_owned(), 1.0)]),
        "ipq_ready as Prometheus sees it"
    );

    // whereabouts: pod b is given pod a's addresses and sends with them before its routes.
    for (addr, peer) in pod_a_and_peer() {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)
            .expect("giving pod b the address");
        let sender = UdpSender {
            bind: Some(addr),
            device: None,
        };
        assert_eq!(
            udp_burst_with(&lab.pod_b, sender, &lab.peer, peer, N),
            0,
            "{addr}: pod b, not its holder, is a duplicate source"
        );
    }
    // Then its host routes: claims over a live holder, fenced under fence-old.
    for (addr, _) in pod_a_and_peer() {
        lab.routes()
            .add_host_route("vethpb", addr, Some(2000))
            .expect("pod b's host route");
        wait_for_entry(&lab, addr, &entry("active", vethpb, vethpa), SETTLE);
    }
    let caused = conflicts([
        ("early_reuse", 2.0),
        ("reuse_in_cooldown", 0.0),
        ("duplicate_source", 2.0),
        ("remote_claim", 0.0),
    ]);
    poll("the agent to count the conflicts", SETTLE, || {
        Ok((agent_conflicts(&agent) == caused).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}: agent says {:?}\nagent log:\n{}",
            agent_conflicts(&agent),
            agent.log()
        )
    });

    let seen = poll("Prometheus to scrape the conflicts", SCRAPED, || {
        let seen = by_label("ipq_conflicts_total", "kind")?;
        Ok((seen == caused).then_some(seen))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}: Prometheus says {:?}\nprometheus log:\n{}",
            by_label("ipq_conflicts_total", "kind"),
            prometheus.log()
        )
    });
    assert_eq!(
        seen,
        agent_conflicts(&agent),
        "Prometheus and the agent's /metrics agree"
    );
    let drops = prometheus
        .query("sum by (hook) (ipq_dropped_packets_total{reason=\"duplicate_source\"})")
        .expect("query");
    assert_eq!(
        drops
            .iter()
            .map(|s| (s.labels["hook"].clone(), s.value))
            .filter(|(_, v)| *v != 0.0)
            .collect::<BTreeMap<_, _>>(),
        BTreeMap::from([("tc_ingress".to_owned(), 2.0 * N as f64)]),
        "duplicate-source drops as Prometheus sees them (pod b's {N} per address)"
    );
    // What Prometheus stored is what the agent serves, label for label.
    let instance = prometheus.query("ipq_conflicts_total").expect("query");
    assert!(
        instance
            .iter()
            .all(|s| s.labels.get("instance").map(String::as_str) == Some(METRICS_ADDR)),
        "every series comes from the lab agent: {instance:?}"
    );
}
