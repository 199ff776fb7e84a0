//! What the API server asks the registry's owner. The server never touches the registry: it
//! sends one of these to the tracker's loop and waits for the reply, so every request is
//! ordered with netlink events, kernel samples and cool-down ticks.

use std::{future::Future, net::IpAddr, pin::Pin};

use tokio::sync::{broadcast, oneshot};

use super::{
    model::{
        AddressList, AddressView, ChangedResponse, ClaimRequest, ClaimResponse, ConflictList,
        DatapathEntryRequest, DatapathEntryView, DrainAttachmentRequest, Event, GcRequest, Status,
    },
    views::ApiError,
};
use crate::registry::StateName;

/// Conflicts the registry's owner keeps for `GET /v1/conflicts` (the most a request gets).
pub const RECENT_CONFLICTS: usize = 256;

pub type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// A claim's answer, ready once every flush the claim started has reported (bounded by
/// `hygiene::CLAIM_WAIT`). The request's own task awaits it: the owner loop neither spawns a
/// task nor waits per claim.
pub type PendingClaim = Pin<Box<dyn Future<Output = Result<ClaimResponse, ApiError>> + Send>>;

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
        reply: oneshot::Sender<PendingClaim>,
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
    /// ipq-ipam's DEL: store this release durably (its addresses completed from the
    /// registry's record of the attachment) and answer it as stored.
    HoldRelease {
        release: Box<ipq_api::model::HeldRelease>,
        reply: Reply<ipq_api::model::HeldRelease>,
    },
    /// Break-glass: one datapath entry written, or removed, by the agent (the maps' one
    /// writer) behind the registry's back.
    DatapathPut {
        addr: IpAddr,
        request: DatapathEntryRequest,
        reply: Reply<DatapathEntryView>,
    },
    DatapathDelete {
        addr: IpAddr,
        reply: Reply<DatapathEntryView>,
    },
    /// ipq-ipam's delegate found a network's range exhausted: wait, or release the quietest
    /// held allocation (`ipam_on_exhausted`). Answered by the releaser when it releases.
    IpamExhausted {
        request: super::model::ExhaustedRequest,
        reply: Reply<super::model::ExhaustedAnswer>,
    },
    /// ipq-ipam's releaser: which addresses of a held allocation are not free yet.
    AllocationBusy {
        query: AllocationQuery,
        reply: Reply<AddressList>,
    },
}

/// A held allocation, as the releaser asks about it: its addresses (when the DEL knew them)
/// and whatever the registry still has for its attachment.
#[derive(Clone, Debug)]
pub struct AllocationQuery {
    pub container_id: String,
    pub ifname: String,
    pub addresses: Vec<IpAddr>,
}

/// An event feed: what happened recently, then what happens next.
pub struct Subscription {
    pub backlog: Vec<Event>,
    pub live: broadcast::Receiver<Event>,
    /// Held for as long as the stream is open: the agent's stop waits until every stream has
    /// sent what was published before it ([`StreamsClosing`](crate::tracker::StreamsClosing)).
    pub open: tokio::sync::mpsc::Sender<()>,
}
