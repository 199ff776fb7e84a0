//! Every error answer: a stable code, an HTTP status that matches it, a message naming the input.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::Holder;

/// Every error response: `{"error": {...}}` with an HTTP status that matches `code`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ApiErrorBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiErrorBody {
    pub code: ErrorCode,
    /// Names the input that was wrong and why.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// The holder in the way (refused, not_holder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// Until when the address is not free (refused during a quarantine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The role the refused request needed (`forbidden`): what the caller lacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Role>,
}

/// What a peer of the API socket may do, from the least to the most.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum Role {
    /// Status, addresses, conflicts, events: a member of `api_group`, or uid 0 without
    /// `CAP_NET_ADMIN` in the initial user namespace.
    Read,
    /// Besides reading, every change but the IPAM routes (claims, drains, releases, GC,
    /// break-glass datapath writes): a member of `api_admin_group`.
    Admin,
    /// Everything: uid 0 with `CAP_NET_ADMIN` in the initial user namespace (the CNI
    /// plugins, `sudo ipq`).
    Root,
    /// A role a newer agent names that this client does not know.
    #[serde(other)]
    Unknown,
}

impl Role {
    /// Who holds this role, for a refusal's message.
    pub const fn holders(self) -> &'static str {
        match self {
            Self::Read => "members of api_group, api_admin_group or root",
            Self::Admin => {
                "root with CAP_NET_ADMIN in the initial user namespace, or members of \
                 api_admin_group"
            }
            Self::Root => "root with CAP_NET_ADMIN in the initial user namespace",
            Self::Unknown => "a role this client does not know",
        }
    }
}

/// Stable error codes. Scripts and the CNI plugin branch on these, never on messages; a newer
/// agent's code reads as [`ErrorCode::Unknown`].
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
#[cfg_attr(test, derive(strum::VariantArray))]
pub enum ErrorCode {
    /// The body is not JSON of the expected shape (400).
    BadRequest,
    /// A field's value is not acceptable: an address, a state name, an empty list (400).
    InvalidArgument,
    /// The address is Free or the path does not exist (404).
    NotFound,
    /// The interface named by the holder does not exist on this node (404).
    UnknownInterface,
    /// `refuse-new`: the address is not free; try again later (409).
    Refused,
    /// The caller is not the address's holder (409).
    NotHolder,
    /// Releasing this address needs `force` (409).
    NotReleasable,
    /// The registry is full; nothing was evicted (507).
    RegistryFull,
    /// The peer's credentials are not allowed on the socket (403).
    Forbidden,
    /// The path exists but not with this method (405).
    MethodNotAllowed,
    /// The agent is starting or stopping (503).
    NotReady,
    /// The change could not be made durable (the journal save failed); retry later (503).
    Unavailable,
    /// Something failed inside the agent (500).
    Internal,
    /// A code a newer agent answers with that this client does not know: the answer's message
    /// still reaches the user, and callers treat it as a failure they cannot branch on (the
    /// agent never sends it).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    pub const fn http_status(self) -> u16 {
        match self {
            Self::BadRequest | Self::InvalidArgument => 400,
            Self::Forbidden => 403,
            Self::NotFound | Self::UnknownInterface => 404,
            Self::MethodNotAllowed => 405,
            Self::Refused | Self::NotHolder | Self::NotReleasable => 409,
            Self::Internal | Self::Unknown => 500,
            Self::NotReady | Self::Unavailable => 503,
            Self::RegistryFull => 507,
        }
    }
}
