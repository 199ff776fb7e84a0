//! What the API server asks the registry's owner. The server never touches the registry: it
//! sends one of these to the tracker's loop and waits for the reply, so every request is
//! ordered with netlink events, kernel samples and cool-down ticks.

use std::net::IpAddr;

use tokio::sync::{broadcast, oneshot};

use super::{
    model::{
        AddressList, AddressView, ChangedResponse, ClaimRequest, ClaimResponse, ConflictList,
        DrainAttachmentRequest, Event, GcRequest, Status,
    },
    views::ApiError,
};
use crate::registry::StateName;

/// Conflicts the registry's owner keeps for `GET /v1/conflicts` (the most a request gets).
pub const RECENT_CONFLICTS: usize = 256;

pub type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

pub enum Command {
    Status(Reply<Status>),
    List {
        state: Option<StateName>,
        reply: Reply<AddressList>,
    },
    Get {
        addr: IpAddr,
        reply: Reply<AddressView>,
    },
    Claim {
        request: ClaimRequest,
        reply: Reply<ClaimResponse>,
    },
    Drain {
        addr: IpAddr,
        reply: Reply<ChangedResponse>,
    },
    DrainAttachment {
        request: DrainAttachmentRequest,
        reply: Reply<ChangedResponse>,
    },
    Release {
        addr: IpAddr,
        force: bool,
        reply: Reply<ChangedResponse>,
    },
    Gc {
        request: GcRequest,
        reply: Reply<ChangedResponse>,
    },
    Conflicts {
        limit: usize,
        reply: Reply<ConflictList>,
    },
    Subscribe(oneshot::Sender<Subscription>),
}

/// An event feed: what happened recently, then what happens next.
pub struct Subscription {
    pub backlog: Vec<Event>,
    pub live: broadcast::Receiver<Event>,
}
