//! Debian's Prometheus scraping the agent on the cluster's node, with the shipped rules.

use std::time::Duration;

use anyhow::{ensure, Context as _};
use ipq_tests::{cluster::host::NODE_IP, netns::NetNs, prometheus::Prometheus};

/// Debian's Prometheus, elsewhere on the network (the peer), scrapes the agent where the
/// pod's `prometheus.io/port` annotation says, as job `ipq` (what the rules expect), with
/// `deploy/prometheus/ipq-rules.yaml` loaded.
pub fn scrapes_the_agent(peer: &NetNs) -> anyhow::Result<Prometheus<'_>> {
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/prometheus/ipq-rules.yaml");
    let prometheus = Prometheus::start_with_rules(
        peer,
        "127.0.0.1:9090",
        "ipq",
        &format!("{NODE_IP}:9740"),
        &[&rules],
    )?;
    ipq_tests::lab::poll(
        "Prometheus to scrape the agent",
        Duration::from_secs(60),
        || {
            let up = prometheus.query("up{job=\"ipq\"} == 1")?;
            let info = prometheus.query("ipq_build_info{job=\"ipq\"}")?;
            Ok((!up.is_empty() && !info.is_empty()).then_some(()))
        },
    )
    .with_context(|| prometheus.log())?;
    let groups = prometheus.rule_groups()?;
    ensure!(
        groups.iter().any(|g| g == "ipq-conflicts"),
        "Prometheus loaded the rule groups {groups:?}"
    );
    Ok(prometheus)
}

/// After the rollout's early reuse, the shipped `IpqEarlyReuse` alert goes off.
pub fn early_reuse_alert_fires(prometheus: &Prometheus<'_>) -> anyhow::Result<()> {
    ipq_tests::lab::poll("the IpqEarlyReuse alert", Duration::from_secs(60), || {
        let alerts = prometheus.query("ALERTS{alertname=\"IpqEarlyReuse\"}")?;
        Ok((!alerts.is_empty()).then_some(()))
    })
    .with_context(|| prometheus.log())
}
