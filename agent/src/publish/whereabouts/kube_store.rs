//! whereabouts' OverlappingRangeIPReservations in the API server: ipq's own made and deleted
//! (only by uid), whereabouts' own of a live pod labelled (a merge patch of metadata, refused
//! if the object changed since it was read), all of them listed and watched by the label naming
//! this node (kube's watcher: [`super::watch`]), and the node's NodeQuarantine read once for
//! the owner reference that has ipq's own collected with it.

use std::{net::IpAddr, path::PathBuf, time::Duration};

use kube::{
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
        Preconditions,
    },
    Api, Client,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{
    super::{
        api_health::ApiHealth,
        client::CachedClient,
        kube_sink::{self, failure, not_found, REQUEST_TIMEOUT},
    },
    projection::reservation_name,
    watch::{self, WATCH_SECONDS},
    Hold, Reserved, Store, StoreEvent, Target,
};
use crate::publish::{FailureReason, WriteError};

pub const GROUP: &str = "whereabouts.cni.cncf.io";
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "OverlappingRangeIPReservation";
pub const PLURAL: &str = "overlappingrangeipreservations";
/// The label that says which node's agent holds a reservation.
pub const NODE_LABEL: &str = "ipq.dev/node";
/// The annotation that carries the address (the name is whereabouts' normalized form).
pub const ADDRESS_ANNOTATION: &str = "ipq.dev/address";
/// The annotation naming the holder the address is kept from the next pod for.
pub const HOLDER_ANNOTATION: &str = "ipq.dev/holder";

/// Watch events waiting for the projection (one per deletion seen): past them the watch waits.
const WATCH_EVENTS: usize = 256;
/// The watch's client waits a little longer than a watch lasts for a word from the API server
/// (a watch is quiet for minutes, longer than a request may be).
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 40);

/// The podRef of ipq's reservations: not a pod that can exist (`:` is in no namespace's
/// name), so whereabouts never takes it for the pod asking for the address.
pub fn quarantine_pod_ref(node: &str) -> String {
    format!("ipq.dev:quarantine/{node}")
}

/// [`NODE_LABEL`]'s value: the node's name, or, over a label value's 63 characters, a digest.
pub fn node_label_value(node: &str) -> String {
    if node.len() <= 63 {
        return node.to_owned();
    }
    // FNV-1a: stable across runs and builds, which std's hasher is not.
    let digest = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("node-{digest:016x}")
}

pub struct KubeStore {
    target: Target,
    kubeconfig: Option<PathBuf>,
    client: CachedClient,
    /// Told of the watch's failures and returns (the NodeQuarantine writer's).
    health: ApiHealth,
    /// The NodeQuarantine's uid, for the owner reference.
    owner_uid: Option<String>,
    events_tx: mpsc::Sender<StoreEvent>,
    events: mpsc::Receiver<StoreEvent>,
    watch: Option<tokio::task::JoinHandle<()>>,
}

impl KubeStore {
    pub fn new(target: Target, kubeconfig: Option<PathBuf>, health: ApiHealth) -> Self {
        // Bounded: a watch whose deletions are not taken waits (and the API server's stream
        // with it, which ends the watch if it waits too long: a fresh list then says what was
        // missed), so a flood of deletions never grows the agent's heap.
        let (events_tx, events) = mpsc::channel(WATCH_EVENTS);
        Self {
            target,
            client: CachedClient::new(kubeconfig.clone(), REQUEST_TIMEOUT),
            kubeconfig,
            health,
            owner_uid: None,
            events_tx,
            events,
            watch: None,
        }
    }

    async fn client(&mut self) -> Result<Client, WriteError> {
        self.client.get().await
    }

    /// `result`, having dropped the client when the failure may be its credentials'.
    fn checked<T>(&mut self, result: Result<T, WriteError>) -> Result<T, WriteError> {
        if let Err(e) = &result {
            self.client.after_failure(e);
        }
        result
    }

    fn reservations(&self, client: Client) -> Api<DynamicObject> {
        reservations(client, &self.target.namespace)
    }

    fn name(&self, addr: IpAddr) -> String {
        reservation_name(addr, &self.target.network_name)
    }

    async fn owner_uid(&mut self, client: &Client) -> Result<String, WriteError> {
        if let Some(uid) = &self.owner_uid {
            return Ok(uid.clone());
        }
        let gvk = GroupVersionKind::gvk(kube_sink::GROUP, kube_sink::VERSION, kube_sink::KIND);
        let objects: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, kube_sink::PLURAL),
        );
        let node = &self.target.node;
        let object = objects.get(node).await.map_err(|e| {
            failure(
                &format!("getting NodeQuarantine {node} (the reservations' owner)"),
                e,
            )
        })?;
        let uid = object.metadata.uid.ok_or_else(|| WriteError {
            reason: FailureReason::Refused,
            message: format!("NodeQuarantine {node} has no uid"),
        })?;
        self.owner_uid = Some(uid.clone());
        Ok(uid)
    }

    /// The reservation ipq makes for `addr`.
    fn body(&self, addr: IpAddr, holder_pod_ref: Option<&str>, owner_uid: &str) -> Value {
        let node = &self.target.node;
        json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": KIND,
            "metadata": {
                "name": self.name(addr),
                "namespace": self.target.namespace,
                "labels": {
                    "app.kubernetes.io/managed-by": "ipq",
                    NODE_LABEL: node_label_value(node),
                },
                "annotations": {
                    ADDRESS_ANNOTATION: addr.to_string(),
                    HOLDER_ANNOTATION: holder_pod_ref.unwrap_or_default(),
                },
                "ownerReferences": [{
                    "apiVersion": format!("{}/{}", kube_sink::GROUP, kube_sink::VERSION),
                    "kind": kube_sink::KIND,
                    "name": node,
                    "uid": owner_uid,
                }],
            },
            "spec": {
                "podref": quarantine_pod_ref(node),
                "ifname": "ipq-quarantine",
            },
        })
    }

    /// `addr`'s reservation, if there is one.
    async fn get(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
    ) -> Result<Option<DynamicObject>, WriteError> {
        api.get_opt(name)
            .await
            .map_err(|e| failure(&format!("getting {KIND} {name}"), e))
    }

    /// Labels `existing` (whereabouts' reservation for `pod_ref`) so that this node's watch
    /// sees it; what that makes of it.
    async fn label(
        &self,
        api: &Api<DynamicObject>,
        addr: IpAddr,
        existing: &DynamicObject,
        pod_ref: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        if let Some(hold) = hold_of(&self.target.node, existing) {
            return Ok(Reserved::AlreadyHeld(hold));
        }
        let its_pod_ref = existing.data["spec"]["podref"].as_str();
        if pod_ref.is_none() || its_pod_ref != pod_ref {
            // Another pod's (or another node's agent's): not ipq's to touch.
            return Ok(Reserved::NotHeld);
        }
        let name = self.name(addr);
        let patch = json!({
            "metadata": {
                // A precondition: refused (409) if whereabouts changed or re-made it since.
                "resourceVersion": existing.metadata.resource_version,
                "labels": {NODE_LABEL: node_label_value(&self.target.node)},
                "annotations": {ADDRESS_ANNOTATION: addr.to_string()},
            }
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(labelled) => Ok(Reserved::Labelled(
                labelled.metadata.uid.unwrap_or_default(),
            )),
            Err(e) => Err(failure(&format!("labelling {KIND} {name}"), e)),
        }
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.abort();
        }
    }
}

/// The reservations in whereabouts' `namespace`.
pub(super) fn reservations(client: Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    Api::namespaced_with(
        client,
        namespace,
        &ApiResource::from_gvk_with_plural(&gvk, PLURAL),
    )
}

/// How ipq holds `object`: `None` when `node`'s agent does not watch it.
pub(super) fn hold_of(node: &str, object: &DynamicObject) -> Option<Hold> {
    let watched = object
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(NODE_LABEL))
        .is_some_and(|value| *value == node_label_value(node));
    let own = object.data["spec"]["podref"].as_str() == Some(quarantine_pod_ref(node).as_str());
    let holder = own
        .then(|| object.metadata.annotations.as_ref()?.get(HOLDER_ANNOTATION))
        .flatten()
        .filter(|holder| !holder.is_empty())
        .cloned();
    watched.then(|| Hold {
        uid: object.metadata.uid.clone().unwrap_or_default(),
        own,
        holder,
    })
}

/// Whether the pod `namespace/name` (of `uid`, when known) is in the API server; a reference
/// that names no pod is taken as present (nothing to make a reservation for).
async fn pod_exists(client: &Client, pod_ref: &str, uid: Option<&str>) -> Result<bool, WriteError> {
    match pod_ref.split_once('/') {
        Some((namespace, name)) => kube_sink::pod_present(client, namespace, name, uid).await,
        None => Ok(true),
    }
}

impl KubeStore {
    async fn reserve_inner(
        &mut self,
        addr: IpAddr,
        pod_ref: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let client = self.client().await?;
        let owner_uid = self.owner_uid(&client).await?;
        let api = self.reservations(client);
        let name = self.name(addr);
        let body = self.body(addr, pod_ref, &owner_uid);
        let object: DynamicObject = serde_json::from_value(body).map_err(|e| WriteError {
            reason: FailureReason::Refused,
            message: format!("{KIND} {name}: {e}"),
        })?;
        match api.create(&PostParams::default(), &object).await {
            Ok(made) => Ok(Reserved::Made(made.metadata.uid.unwrap_or_default())),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                match self.get(&api, &name).await? {
                    Some(existing) => self.label(&api, addr, &existing, pod_ref).await,
                    // Deleted since: made on the next round.
                    None => Err(WriteError {
                        reason: FailureReason::Refused,
                        message: format!("{KIND} {name} went while it was being made"),
                    }),
                }
            }
            Err(e) => Err(failure(&format!("creating {KIND} {name}"), e)),
        }
    }

    async fn watch_inner(
        &mut self,
        addr: IpAddr,
        pod_ref: &str,
        pod_uid: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let client = self.client().await?;
        let api = self.reservations(client.clone());
        let name = self.name(addr);
        if let Some(existing) = self.get(&api, &name).await? {
            return self.label(&api, addr, &existing, Some(pod_ref)).await;
        }
        // No reservation: not whereabouts' address, or whereabouts freed it when the pod was
        // deleted (force-deleted while its container runs here) and no run of the agent was
        // watching (the delete landed during a restart). Whereabouts' control loop frees on
        // the Pod's DELETE, so a reservation found missing after the pod is gone is the second.
        if pod_exists(&client, pod_ref, pod_uid).await? {
            return Ok(Reserved::NotHeld);
        }
        self.reserve_inner(addr, Some(pod_ref)).await
    }

    async fn delete_inner(&mut self, addr: IpAddr, uid: &str) -> Result<(), WriteError> {
        let client = self.client().await?;
        let api = self.reservations(client);
        let name = self.name(addr);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &params).await {
            Ok(_) => Ok(()),
            // Gone already, or no longer the one ipq made (a uid precondition that fails is a
            // 409): either way not ipq's to delete.
            Err(e) if not_found(&e) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(failure(&format!("deleting {KIND} {name}"), e)),
        }
    }
}

impl Store for KubeStore {
    fn follow(&mut self) {
        if let Some(old) = self.watch.take() {
            old.abort();
        }
        self.watch = Some(tokio::spawn(watch::follow(
            self.target.clone(),
            CachedClient::new(self.kubeconfig.clone(), WATCH_READ_TIMEOUT),
            self.health.clone(),
            self.events_tx.clone(),
        )));
    }

    async fn reserve(
        &mut self,
        addr: IpAddr,
        pod_ref: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let result = self.reserve_inner(addr, pod_ref).await;
        self.checked(result)
    }

    async fn watch(
        &mut self,
        addr: IpAddr,
        pod_ref: &str,
        pod_uid: Option<&str>,
    ) -> Result<Reserved, WriteError> {
        let result = self.watch_inner(addr, pod_ref, pod_uid).await;
        self.checked(result)
    }

    async fn delete(&mut self, addr: IpAddr, uid: &str) -> Result<(), WriteError> {
        let result = self.delete_inner(addr, uid).await;
        self.checked(result)
    }

    async fn event(&mut self) -> StoreEvent {
        match self.events.recv().await {
            Some(event) => event,
            // Not before the store is dropped: it keeps a sender.
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest is FNV-1a 64 of the name: the expected values were computed outside the code
    /// under test (by a separate FNV-1a in Python), so a changed hash, seed or format fails
    /// here, not only one that varies between calls.
    #[test]
    fn a_long_node_name_is_labelled_by_a_stable_digest() {
        assert_eq!(node_label_value("ipq-node"), "ipq-node");
        let exactly_63 = "m".repeat(63);
        assert_eq!(node_label_value(&exactly_63), exactly_63);
        assert_eq!(node_label_value(&"x".repeat(64)), "node-b96a5acbb56db825");
        assert_eq!(node_label_value(&"n".repeat(100)), "node-798e0af16b2cf3f5");
    }

    /// A namespace is a DNS-1123 label (RFC 1123: lowercase letters, digits and `-`, starting
    /// and ending with a letter or digit, at most 63): what the API server accepts for one.
    fn is_dns1123_label(s: &str) -> bool {
        let bytes = s.as_bytes();
        (1..=63).contains(&bytes.len())
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            && bytes[0] != b'-'
            && bytes[bytes.len() - 1] != b'-'
    }

    #[test]
    fn the_pod_ref_names_no_pod_that_can_exist() {
        assert_eq!(
            quarantine_pod_ref("ipq-node"),
            "ipq.dev:quarantine/ipq-node"
        );
        for node in ["ipq-node", "n1", &"n".repeat(253)] {
            let pod_ref = quarantine_pod_ref(node);
            let (namespace, name) = pod_ref.split_once('/').unwrap();
            assert_eq!(name, node);
            // Whatever the node, the namespace part can name no namespace, so no pod.
            assert!(
                !is_dns1123_label(namespace),
                "{namespace} is a valid namespace"
            );
        }
        // The check itself tells a real namespace from this one.
        for real in ["default", "kube-system", "a", "ns-1"] {
            assert!(is_dns1123_label(real), "{real}");
        }
    }
}
