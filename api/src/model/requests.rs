//! What `/v1` accepts: the bodies of its POST and PUT requests.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::{PodRef, StateName};

/// `POST /v1/claims`: `holder` claims every address in `addresses`, all or none.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub addresses: Vec<IpAddr>,
    pub holder: HolderSpec,
    /// Who asks: `cni` (ipq-cni) or `api` (an IPAM, an operator; the default). Both are
    /// explicit claims, which `refuse-new` can refuse.
    #[serde(default = "api_source")]
    pub source: ClaimSource,
}

/// The callers of `POST /v1/claims`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimSource {
    Cni,
    Api,
}

fn api_source() -> ClaimSource {
    ClaimSource::Api
}

/// Who claims: the host-side interface by name plus whatever identity the caller knows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderSpec {
    /// The host-side interface (the pod's veth peer, a bridge port).
    pub interface: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The container-side interface name (`CNI_IFNAME`), which with the container id names a
    /// CNI attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_ifname: Option<String>,
    /// The CNI network (the conflist's `name`) the attachment belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// The MAC of the holder's interface inside its sandbox (`aa:bb:cc:dd:ee:ff`, from the
    /// CNI prevResult): what reuse hygiene announces the address at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// `POST /v1/drains`: the holder of a CNI attachment is terminating (CNI DEL). Idempotent:
/// nothing to drain is success. Drains every address whose live holder has `container_id`
/// (and `cni_ifname`, when given), plus `addresses` whose holder is that container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainAttachmentRequest {
    pub container_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_ifname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
}

/// `POST /v1/addresses/{ip}/release`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Needed to end a quarantine early or to free a live holder's address.
    #[serde(default)]
    pub force: bool,
}

/// One CNI attachment, as `cni.dev/valid-attachments` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// `POST /v1/gc`: drain every CNI-made holder whose attachment is not in `valid_attachments`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcRequest {
    pub valid_attachments: Vec<Attachment>,
    /// The CNI network being collected: holders of another network are left alone. Without
    /// it, every CNI-made holder is judged by `valid_attachments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

/// `POST /v1/ipam/exhausted`: ipq-ipam's delegate said the range of `network` is used up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExhaustedRequest {
    /// The network's `name`, as the held releases have it ("" for a config without one).
    pub network: String,
    /// The container whose ADD found the range exhausted (for the log and the event).
    pub container_id: String,
}

/// `PUT /v1/datapath/{ip}`: break-glass, one datapath entry written by the agent itself (the
/// maps' one writer) without the registry knowing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatapathEntryRequest {
    /// `active`, `draining` or `quarantined` (the agent refuses `free`).
    pub state: StateName,
    /// The interface of the holder whose traffic flows (required but for `quarantined`).
    #[serde(default)]
    pub holder: Option<String>,
    /// An interface whose packets with this address are dropped both ways.
    #[serde(default)]
    pub fenced: Option<String>,
}
