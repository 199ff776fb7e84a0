//! Writing Events (`events.k8s.io/v1`) to the API server: a create per new series, a merge
//! patch of its `series` after. The client, its timeouts and the classification of failures
//! are the NodeQuarantine publisher's ([`crate::publish`]).

use std::{
    future::Future,
    path::PathBuf,
    time::{SystemTime, UNIX_EPOCH},
};

use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    Api,
};
use serde_json::{json, Value};
use thiserror::Error;

use super::notice::Notice;
use crate::publish::{kube_failure, CachedClient, WriteError, REQUEST_TIMEOUT};

/// The Events' `reportingController`: ipq's agent, named in ipq's API group.
pub const REPORTING_CONTROLLER: &str = "ipq.dev/agent";
/// The API server refuses a longer `note`.
const MAX_NOTE: usize = 1024;
/// An object name is at most 253 characters; the suffix takes 17.
const MAX_NAME_PREFIX: usize = 253 - 17;

#[derive(Debug, Error)]
pub enum SinkError {
    /// The Event is not there any more (expired, deleted): the series starts again.
    #[error("the Event is gone")]
    Gone,
    #[error(transparent)]
    Failed(#[from] WriteError),
}

/// Where Events go: the API server, or a test's recorder.
pub trait EventSink {
    /// Creates the Event of `notice`'s first occurrence; answers its name.
    fn create(&mut self, notice: &Notice)
        -> impl Future<Output = Result<String, SinkError>> + Send;
    /// Sets the series of Event `event` in `namespace`.
    fn patch(
        &mut self,
        namespace: &str,
        event: &str,
        count: u32,
        last_observed: SystemTime,
    ) -> impl Future<Output = Result<(), SinkError>> + Send;
}

/// The API server as the Events' sink.
pub struct KubeEvents {
    node: String,
    /// Made again when its credentials' files change or a call fails to connect or
    /// authenticate, as the publisher's.
    client: CachedClient,
}

impl KubeEvents {
    pub fn new(node: String, kubeconfig: Option<PathBuf>) -> Self {
        Self {
            node,
            client: CachedClient::new(kubeconfig, REQUEST_TIMEOUT),
        }
    }

    async fn events(&mut self, namespace: &str) -> Result<Api<DynamicObject>, WriteError> {
        let client = self.client.get().await?;
        let gvk = GroupVersionKind::gvk("events.k8s.io", "v1", "Event");
        Ok(Api::namespaced_with(
            client,
            namespace,
            &ApiResource::from_gvk_with_plural(&gvk, "events"),
        ))
    }
}

/// The Event of `notice`'s first occurrence, written by the agent of `node`.
pub fn event_body(notice: &Notice, node: &str, name: &str) -> Value {
    let mut regarding = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": notice.pod.namespace,
        "name": notice.pod.name,
    });
    if let Some(uid) = &notice.pod.uid {
        regarding["uid"] = json!(uid);
    }
    json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": name,
            "namespace": notice.pod.namespace,
            "labels": {"app.kubernetes.io/name": "ipq"},
        },
        "eventTime": micro_time(notice.observed_at),
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": node,
        "action": notice.reason.action(),
        "reason": <&str>::from(notice.reason),
        "type": "Warning",
        "note": truncated(&notice.note, MAX_NOTE),
        "regarding": regarding,
    })
}

/// The patch that sets a series: `count` occurrences, the last at `last_observed`.
pub fn series_patch(count: u32, last_observed: SystemTime) -> Value {
    json!({"series": {"count": count, "lastObservedTime": micro_time(last_observed)}})
}

/// A new Event's name: the pod's, then the time in hex (client-go's convention), unique per
/// pod and reason in practice.
pub fn event_name(notice: &Notice) -> String {
    let nanos = notice
        .observed_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let prefix = truncated(&notice.pod.name, MAX_NAME_PREFIX).trim_end_matches('.');
    format!("{prefix}.{nanos:016x}")
}

/// A MicroTime as the API server wants it: RFC 3339, UTC, microseconds.
fn micro_time(at: SystemTime) -> String {
    humantime::format_rfc3339_micros(at).to_string()
}

fn truncated(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl EventSink for KubeEvents {
    async fn create(&mut self, notice: &Notice) -> Result<String, SinkError> {
        let name = event_name(notice);
        let body = event_body(notice, &self.node, &name);
        let object: DynamicObject = serde_json::from_value(body).map_err(|e| WriteError {
            reason: crate::publish::FailureReason::Config,
            message: format!("building Event {name}: {e}"),
        })?;
        let created = self
            .events(&notice.pod.namespace)
            .await?
            .create(&PostParams::default(), &object)
            .await;
        if let Err(e) = created {
            let failure = kube_failure(
                &format!("creating Event {}/{name}", notice.pod.namespace),
                e,
            );
            self.client.after_failure(&failure);
            return Err(failure.into());
        }
        Ok(name)
    }

    async fn patch(
        &mut self,
        namespace: &str,
        event: &str,
        count: u32,
        last_observed: SystemTime,
    ) -> Result<(), SinkError> {
        let patched = self
            .events(namespace)
            .await?
            .patch(
                event,
                &PatchParams::default(),
                &Patch::Merge(series_patch(count, last_observed)),
            )
            .await;
        match patched {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(SinkError::Gone),
            Err(e) => {
                let failure = kube_failure(&format!("patching Event {namespace}/{event}"), e);
                self.client.after_failure(&failure);
                Err(failure.into())
            }
        }
    }
}
