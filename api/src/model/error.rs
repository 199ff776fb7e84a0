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
