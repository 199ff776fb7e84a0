//! The other nodes' quarantines, for `ipq status`: their NodeQuarantine objects, listed every
//! [`READ_EVERY`] (and up to half of it more at random, as [`Backoff`] spreads every retry:
//! the nodes' lists do not meet at the API server) by a task off the agent's loop (where RBAC grants `list`), summarized with a
//! bound ([`summarize`]: per node its counts and its [`NEWEST`] newest entries, at most
//! [`MAX_NODES`] nodes). Enforcement never depends on it; a failing read is shown, not retried
//! faster.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use log::debug;
use serde_json::Value;

use super::{kube_client, kube_failure, Backoff, GROUP, KIND, PLURAL, VERSION};
use crate::api::model::{ClusterEntry, ClusterView, NodeQuarantineSummary};

/// How often the objects are listed.
pub const READ_EVERY: Duration = Duration::from_secs(30);
/// Newest entries shown per node.
pub const NEWEST: usize = 3;
/// Nodes shown at most (those with most listed first).
pub const MAX_NODES: usize = 32;

/// The agent's end: the last summary.
pub struct ClusterReader {
    view: Arc<Mutex<ClusterView>>,
}

impl ClusterReader {
    /// Starts listing the objects of every node but `own` on the current runtime.
    pub fn start(own: String, kubeconfig: Option<PathBuf>) -> Self {
        let view = Arc::new(Mutex::new(ClusterView::default()));
        tokio::spawn(read_forever(own, kubeconfig, view.clone()));
        Self { view }
    }

    pub fn view(&self) -> ClusterView {
        self.view
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

async fn read_forever(own: String, kubeconfig: Option<PathBuf>, view: Arc<Mutex<ClusterView>>) {
    let mut pace = Backoff::new(READ_EVERY, READ_EVERY);
    loop {
        let read = read_once(&own, kubeconfig.as_deref()).await;
        {
            let mut view = view.lock().unwrap_or_else(|p| p.into_inner());
            match read {
                Ok(summary) => {
                    *view = summary;
                    view.read_at =
                        Some(humantime::format_rfc3339_seconds(SystemTime::now()).to_string());
                }
                Err(message) => {
                    debug!("reading the other nodes' NodeQuarantines: {message}");
                    view.last_error = Some(message);
                }
            }
        }
        tokio::time::sleep(pace.next_delay()).await;
    }
}

async fn read_once(own: &str, kubeconfig: Option<&std::path::Path>) -> Result<ClusterView, String> {
    let client = kube_client(kubeconfig).await.map_err(|e| e.message)?;
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    let objects = kube::Api::<DynamicObject>::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, PLURAL),
    )
    .list(&ListParams::default())
    .await
    .map_err(|e| kube_failure(&format!("listing {PLURAL}"), e).message)?;
    let statuses: Vec<(String, Value)> = objects
        .items
        .into_iter()
        .filter_map(|o| {
            let name = o.metadata.name?;
            Some((name, o.data.get("status").cloned().unwrap_or(Value::Null)))
        })
        .collect();
    Ok(summarize(own, &statuses))
}

/// The bounded summary of the objects' statuses (`(node, status)`), `own` left out: nodes with
/// anything listed, most first, at most [`MAX_NODES`]; per node its counts and its [`NEWEST`]
/// entries by `since`.
pub fn summarize(own: &str, objects: &[(String, Value)]) -> ClusterView {
    let count = |status: &Value, key: &str| status[key].as_u64().unwrap_or(0);
    let mut nodes: Vec<NodeQuarantineSummary> = objects
        .iter()
        .filter(|(node, _)| node != own)
        .map(|(node, status)| {
            let mut entries: Vec<&Value> = status["entries"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            // RFC 3339 UTC stamps of one writer sort as text.
            entries.sort_by(|a, b| b["since"].as_str().cmp(&a["since"].as_str()));
            NodeQuarantineSummary {
                node: node.clone(),
                quarantined: count(status, "quarantined"),
                fenced: count(status, "fenced"),
                orphaned: count(status, "orphaned"),
                newest: entries.into_iter().take(NEWEST).map(entry).collect(),
            }
        })
        .filter(|n| listed(n) > 0)
        .collect();
    nodes.sort_by(|a, b| listed(b).cmp(&listed(a)).then_with(|| a.node.cmp(&b.node)));
    let nodes_omitted = nodes.len().saturating_sub(MAX_NODES) as u64;
    nodes.truncate(MAX_NODES);
    ClusterView {
        read_at: None,
        last_error: None,
        nodes,
        nodes_omitted,
    }
}

/// Every entry a node's object counts.
fn listed(node: &NodeQuarantineSummary) -> u64 {
    node.quarantined + node.fenced + node.orphaned
}

fn entry(value: &Value) -> ClusterEntry {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let holder = &value["holder"];
    let pod = match (holder["namespace"].as_str(), holder["pod"].as_str()) {
        (Some(namespace), Some(pod)) => Some(format!("{namespace}/{pod}")),
        _ => None,
    };
    ClusterEntry {
        address: text(&value["address"]),
        state: text(&value["state"]),
        since: text(&value["since"]),
        pod,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status(quarantined: u64, fenced: u64, sinces: &[&str]) -> Value {
        let entries: Vec<Value> = sinces
            .iter()
            .enumerate()
            .map(|(i, since)| {
                json!({"address": format!("10.0.0.{i}"), "state": "quarantined", "since": since,
                       "holder": {"namespace": "default", "pod": format!("web-{i}")}})
            })
            .collect();
        json!({"quarantined": quarantined, "fenced": fenced, "entries": entries})
    }

    #[test]
    fn the_summary_leaves_out_this_node_and_the_empty_ones_and_keeps_the_newest() {
        let objects = vec![
            ("node-a".to_owned(), status(9, 0, &["2026-01-01T00:00:00Z"])),
            (
                "node-b".to_owned(),
                status(
                    3,
                    1,
                    &[
                        "2026-01-01T00:00:01Z",
                        "2026-01-01T00:00:04Z",
                        "2026-01-01T00:00:02Z",
                        "2026-01-01T00:00:03Z",
                    ],
                ),
            ),
            ("node-c".to_owned(), status(0, 0, &[])),
            (
                "node-e".to_owned(),
                json!({"quarantined": 0, "fenced": 0, "orphaned": 2, "entries": []}),
            ),
            ("node-d".to_owned(), status(5, 0, &["2026-01-01T00:00:00Z"])),
        ];
        let view = summarize("node-a", &objects);
        let names: Vec<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(names, ["node-d", "node-b", "node-e"]);
        assert_eq!(
            view.nodes[2].orphaned, 2,
            "a node with only orphans is listed"
        );
        let b = &view.nodes[1];
        assert_eq!((b.quarantined, b.fenced), (3, 1));
        let newest: Vec<&str> = b.newest.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(newest, ["10.0.0.1", "10.0.0.3", "10.0.0.2"]);
        assert_eq!(b.newest[0].pod.as_deref(), Some("default/web-1"));
        assert_eq!(view.nodes_omitted, 0);
    }

    #[test]
    fn past_the_cap_nodes_are_counted_not_listed() {
        let objects: Vec<(String, Value)> = (0..MAX_NODES + 5)
            .map(|i| (format!("node-{i:03}"), status(1, 0, &[])))
            .collect();
        let view = summarize("own", &objects);
        assert_eq!(view.nodes.len(), MAX_NODES);
        assert_eq!(view.nodes_omitted, 5);
    }
}
