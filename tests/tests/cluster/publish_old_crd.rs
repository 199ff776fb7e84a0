//! The NodeQuarantine writer against a real API server whose CRD predates the `orphaned`
//! state, as a cluster upgraded with Helm has it (Helm never upgrades a CRD). The agent's own
//! writer and API client run in this test's process, in the control plane's network namespace,
//! with the agent's ServiceAccount token and RBAC from `deploy/kubernetes/`; the orphans are
//! handed to it as the whereabouts projection hands them.
//!
//! What the real API server answers (its 422 for the unknown enum value) is what the writer
//! recognizes: it writes everything else at once, shows the orphans it left out, and lists them
//! once the operator applies the new CRD.

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use ipq::{
    publish::{
        start_with, ApiHealth, EntryState, KubeSink, Orphans, PublishMetrics, PublishedEntry,
        Timing,
    },
    registry::Holder,
};
use ipq_tests::{cluster::api_server::ApiServer, lab::poll};
use serde_json::Value;

const NODE: &str = "ipq-old-crd-node";
/// The CRD as `deploy/kubernetes/` ships it, and the line an older release had instead.
const CRD: &str = "05-nodequarantine-crd.yaml";
const STATE_ENUM: &str = r#"enum: ["quarantined", "fenced", "orphaned"]"#;
const OLD_STATE_ENUM: &str = r#"enum: ["quarantined", "fenced"]"#;
/// How soon the writer tries the orphans again after a refusal (10 minutes in the agent).
const ORPHANS_RETRY: Duration = Duration::from_secs(3);
const WITHIN: Duration = Duration::from_secs(30);

fn entry(state: EntryState, i: u8) -> PublishedEntry {
    PublishedEntry {
        state,
        since: 0,
        until: None,
        holder: Holder::new(u32::from(i), format!("veth{i}")),
    }
}

fn addr(i: u8) -> IpAddr {
    IpAddr::from([10, 88, 0, i])
}

/// `(address, state)` of every entry the object lists.
fn listed(api: &ApiServer) -> anyhow::Result<Vec<(String, String)>> {
    let object: Value = api.kubectl().json(&["get", "nodequarantines", NODE])?;
    Ok(object["status"]["entries"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    (
                        e["address"].as_str().unwrap_or_default().to_owned(),
                        e["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

fn pair(i: u8, state: &str) -> (String, String) {
    (addr(i).to_string(), state.to_owned())
}

/// `kubectl apply` of the shipped CRD, or of it as an older release had it.
fn apply_crd(api: &ApiServer, old: bool) -> anyhow::Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes")
        .join(CRD);
    let text = std::fs::read_to_string(&path)?;
    ensure!(
        text.contains(STATE_ENUM),
        "{} lacks {STATE_ENUM}",
        path.display()
    );
    let text = if old {
        text.replace(STATE_ENUM, OLD_STATE_ENUM)
    } else {
        text
    };
    api.kubectl().apply(&text)?;
    Ok(())
}

/// What the API server answers a status with an orphaned entry, tried without being stored
/// (`--dry-run=server`): `Err` with its message when it refuses.
fn try_orphaned_status(api: &ApiServer) -> anyhow::Result<()> {
    let patch = format!(
        r#"{{"status":{{"entries":[{{"address":"{}","state":"orphaned","since":"2026-11-30T00:00:00Z"}}]}}}}"#,
        addr(99)
    );
    api.kubectl()
        .run(&[
            "patch",
            "nodequarantine",
            NODE,
            "--subresource=status",
            "--type=merge",
            "--dry-run=server",
            "-p",
            &patch,
        ])
        .map(|_| ())
}

/// Injected: the CRD replaced by an older one (no `orphaned`) after the agent's first write,
/// then an orphan handed to the writer, then the shipped CRD applied again.
/// Holds: the real API server refuses the state with the text the writer recognizes; the
/// writer then writes the rest (a quarantine added after the refusal is listed), shows the
/// orphan as left out (`ipq status`'s view and `ipq_publish_orphans_withheld`) and counts one
/// refused write; once the shipped CRD is back, the orphan is listed and nothing is left out.
#[test]
fn an_older_crd_costs_the_orphaned_entries_only_until_the_new_one_is_applied() -> anyhow::Result<()>
{
    let api = ApiServer::start(NODE)?;
    let kubeconfig = api.host.dir().join("agent-kubeconfig");
    api.agent_kubeconfig(&kubeconfig, Duration::from_secs(3600))?;
    // The writer's sockets must be in the control plane's namespace: its runtime and every
    // worker thread are made on a thread that entered it.
    api.host.node.run(|| -> anyhow::Result<()> {
        let runtime = tokio::runtime::Runtime::new()?;
        let _inside = runtime.enter();
        let metrics = Arc::new(PublishMetrics::register(&prometheus::Registry::new())?);
        let timing = Timing {
            orphans_retry: ORPHANS_RETRY,
            ..Timing::default()
        };
        let mut feed = start_with(
            NODE.into(),
            KubeSink::new(NODE.into(), Some(kubeconfig.clone())),
            timing,
            metrics.clone(),
            ApiHealth::new(),
        );
        feed.send(addr(2), Some(entry(EntryState::Quarantined, 2)));
        feed.launch();
        poll("the first write", WITHIN, || {
            Ok((listed(&api)? == [pair(2, "quarantined")]).then_some(()))
        })
        .with_context(|| api.logs())?;

        apply_crd(&api, true)?;
        // The new schema is in force once the API server refuses what it lacks.
        let mut refusal = String::new();
        poll("the API server to refuse the state", WITHIN, || {
            Ok(match try_orphaned_status(&api) {
                Ok(()) => None,
                Err(e) => {
                    refusal = format!("{e:#}");
                    Some(())
                }
            })
        })?;
        ensure!(
            refusal.contains(r#"Unsupported value: "orphaned""#),
            "the API server's refusal: {refusal}"
        );

        let handed = Instant::now();
        feed.orphans().send_replace(Orphans::new(
            [(addr(1), entry(EntryState::Orphaned, 1))].into(),
        ));
        poll("the orphan left out and shown", WITHIN, || {
            Ok((feed.view().orphans_withheld == Some(1)).then_some(()))
        })?;
        feed.send(addr(3), Some(entry(EntryState::Quarantined, 3)));
        poll("the rest written without the orphan", WITHIN, || {
            Ok((listed(&api)? == [pair(2, "quarantined"), pair(3, "quarantined")]).then_some(()))
        })?;
        ensure!(
            metrics.orphans_withheld.get() == 1,
            "ipq_publish_orphans_withheld is {}",
            metrics.orphans_withheld.get()
        );
        // One refusal, then one per retry of the orphans: not a backoff of failing writes.
        let refused = metrics.failures.with_label_values(&["refused"]).get();
        let retries = (handed.elapsed().as_secs_f64() / ORPHANS_RETRY.as_secs_f64()) as u64;
        ensure!(
            (1..=1 + retries).contains(&refused),
            "{refused} refused writes in {:?}",
            handed.elapsed()
        );

        apply_crd(&api, false)?;
        poll(
            "the orphan listed once the shipped CRD is back",
            WITHIN,
            || {
                Ok((listed(&api)?
                    == [
                        pair(1, "orphaned"),
                        pair(2, "quarantined"),
                        pair(3, "quarantined"),
                    ])
                .then_some(()))
            },
        )?;
        poll("nothing left out", WITHIN, || {
            Ok(
                (feed.view().orphans_withheld.is_none() && metrics.orphans_withheld.get() == 0)
                    .then_some(()),
            )
        })?;
        let object: Value = api.kubectl().json(&["get", "nodequarantines", NODE])?;
        ensure!(
            object["status"]["orphaned"] == 1 && object["status"]["quarantined"] == 2,
            "{}",
            object["status"]
        );
        drop(feed);
        Ok(())
    })
}
