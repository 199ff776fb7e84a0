//! Writing the object to the API server: a client from the kubeconfig named in the
//! configuration or the pod's service account, the object made once (server-side apply, owned
//! by its Node so that it is collected with it), then each status by server-side apply on the
//! status subresource.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    config::{KubeConfigOptions, Kubeconfig},
    Api, Client, Config,
};
use serde_json::{json, Value};

use super::{client::CachedClient, FailureReason, Sink, WriteError};

pub const GROUP: &str = "ipq.dev";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NodeQuarantine";
pub const PLURAL: &str = "nodequarantines";
/// The field manager of every apply: the agent owns the object's status and nothing else.
pub const FIELD_MANAGER: &str = "ipq-agent";

/// Short: a node's agent must not sit on a dead API server while changes pile up (they are
/// carried by the retry anyway).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The API server as the publisher's sink.
pub struct KubeSink {
    node: String,
    client: CachedClient,
    /// The Node's uid, for the owner reference; fetched with the object's first apply.
    node_uid: Option<String>,
    /// The object exists as this agent applied it (else the next write applies it first).
    object_applied: bool,
}

impl KubeSink {
    pub fn new(node: String, kubeconfig: Option<PathBuf>) -> Self {
        Self {
            node,
            client: CachedClient::new(kubeconfig, REQUEST_TIMEOUT),
            node_uid: None,
            object_applied: false,
        }
    }

    fn objects(client: Client) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
        Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, PLURAL))
    }

    /// Nodes read as dynamic objects: only their uid is wanted, and k8s-openapi's typed Node
    /// (its whole status) would be code the agent carries and never needs.
    fn nodes(client: Client) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("", "v1", "Node");
        Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, "nodes"))
    }

    /// Makes (or takes back) the object, owned by the Node.
    async fn apply_object(&mut self, client: &Client) -> Result<(), WriteError> {
        let uid = match &self.node_uid {
            Some(uid) => uid.clone(),
            None => {
                let node = Self::nodes(client.clone())
                    .get(&self.node)
                    .await
                    .map_err(|e| failure(&format!("getting Node {}", self.node), e))?;
                let uid = node.metadata.uid.ok_or_else(|| WriteError {
                    reason: FailureReason::Refused,
                    message: format!("Node {} has no uid", self.node),
                })?;
                self.node_uid = Some(uid.clone());
                uid
            }
        };
        let object = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {
                "name": self.node,
                "labels": {"app.kubernetes.io/name": "ipq"},
                "ownerReferences": [{
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": self.node,
                    "uid": uid,
                }],
            },
            "spec": {},
        });
        Self::objects(client.clone())
            .patch(&self.node, &apply_params(), &Patch::Apply(object))
            .await
            .map_err(|e| failure(&format!("applying {KIND} {}", self.node), e))?;
        self.object_applied = true;
        Ok(())
    }
}

/// A client for the API server of `kubeconfig`, or of the pod's service account, that waits
/// `read_timeout` at most for an answer (a watch's client waits longer than its watch lasts).
pub(crate) async fn client_for(
    kubeconfig: Option<&Path>,
    read_timeout: Duration,
) -> Result<Client, WriteError> {
    let config_error = |message: String| WriteError {
        reason: FailureReason::Config,
        message,
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| config_error(format!("kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| config_error(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => Config::incluster().map_err(|e| {
            config_error(format!(
                "no in-cluster service account ({e}); set kubernetes.kubeconfig or run in the \
                 DaemonSet"
            ))
        })?,
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(read_timeout);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    Client::try_from(config).map_err(|e| config_error(format!("making the API client: {e}")))
}

fn apply_params() -> PatchParams {
    // Forced: this node's agent is the object's one writer; a field another manager took
    // (an operator's kubectl edit) is taken back.
    PatchParams::apply(FIELD_MANAGER).force()
}

/// A client error as a failure: credentials the API server does not accept (401) are
/// `config`, any other answer from it `refused`, anything else (connect, TLS, timeout)
/// `unreachable`.
pub(crate) fn failure(what: &str, e: kube::Error) -> WriteError {
    let reason = match &e {
        kube::Error::Api(status) if status.code == 401 => FailureReason::Config,
        kube::Error::Api(_) => FailureReason::Refused,
        _ => FailureReason::Unreachable,
    };
    WriteError {
        reason,
        message: format!("{what}: {e}"),
    }
}

/// Whether pod `namespace/name` is in the API server: the same name and, when `uid` is given,
/// the same uid (a pod made again under its name, a StatefulSet's, is another pod). One `get`
/// of its metadata. Asked by the whereabouts projection (a live holder's reservation gone) and
/// before a remote claim fences a live pod.
pub async fn pod_present(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<bool, WriteError> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), namespace);
    let found = pods
        .get_metadata_opt(name)
        .await
        .map_err(|e| failure(&format!("getting pod {namespace}/{name}"), e))?;
    Ok(found.is_some_and(|pod| uid.is_none() || pod.metadata.uid.as_deref() == uid))
}

pub(super) fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

impl Sink for KubeSink {
    async fn write(&mut self, status: &Value) -> Result<(), WriteError> {
        let written = self.write_with_client(status).await;
        if let Err(e) = &written {
            self.client.after_failure(e);
        }
        written
    }
}

impl KubeSink {
    async fn write_with_client(&mut self, status: &Value) -> Result<(), WriteError> {
        let client = self.client.get().await?;
        if !self.object_applied {
            self.apply_object(&client).await?;
        }
        let body = json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {"name": self.node},
            "status": status,
        });
        let written = Self::objects(client)
            .patch_status(&self.node, &apply_params(), &Patch::Apply(body))
            .await;
        match written {
            Ok(_) => Ok(()),
            Err(e) => {
                if not_found(&e) {
                    // Deleted under us (or its Node re-created): made again on the retry.
                    self.object_applied = false;
                    self.node_uid = None;
                }
                Err(failure(&format!("writing {KIND} {} status", self.node), e))
            }
        }
    }
}
