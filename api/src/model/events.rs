//! `GET /v1/events`: one newline-delimited JSON object per event.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{ConflictView, ExhaustedAnswer, HygieneView};
use crate::{
    CheckedMap, EntryState, EventHook, Holder, LostPart, SampleAction, SampleReason, StateName,
};

/// One line of `GET /v1/events` (newline-delimited JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event the agent published; a gap means events were lost (a
    /// `lost` marker, which carries seq 0 and is outside the sequence, says how many).
    pub seq: u64,
    pub at: String,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// A registry conflict.
    Conflict(Box<ConflictView>),
    /// An address changed state (or holder).
    Transition {
        address: IpAddr,
        from: StateName,
        to: StateName,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
    },
    /// A packet the kernel dropped, observed or reported, sampled (rate-limited per address).
    Sample {
        address: IpAddr,
        hook: EventHook,
        reason: SampleReason,
        action: SampleAction,
        /// The address's state in the datapath when the packet was seen.
        state: EntryState,
        /// The interface the packet was seen on, by index and name.
        ifindex: u32,
        #[serde(default)]
        seen_on: String,
        holder_ifindex: u32,
        /// Who the registry says holds the address (for a quarantined one, who held it last).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        holder: Option<Holder>,
        src_mac: String,
        pkt_len: u32,
    },
    /// A reuse-hygiene pass finished.
    Hygiene(Box<HygieneView>),
    /// Another tool took ipq's program off a hook (a qdisc or filter deleted, a filter put in
    /// its place, a link detached, a pin removed).
    AttachmentLost {
        interface: String,
        ifindex: u32,
        /// `tc_ingress`, `tc_egress`, `xdp`, or `none` for a map's or a program's pin.
        hook: EventHook,
        /// `qdisc`, `filter`, `link` or `pin`.
        what: LostPart,
        /// Whether ipq's program is back on the hook.
        repaired: bool,
        /// Why it is not (yet): retried with backoff, the interface unprotected meanwhile.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The verification found an entry of one of ipq's maps different from what ipq wrote
    /// (another process wrote the map) and wrote ipq's back.
    MapRewritten {
        /// `IPQ_ADDRS`, `IPQ_SLOTS`, `IPQ_IFACES` or `IPQ_QBLOOM`.
        map: CheckedMap,
        /// The address, or `slot N`, `word N`.
        key: String,
        found: String,
        wanted: String,
        /// Whether ipq's entry is back.
        repaired: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// What found it (absent from an older agent's events).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        found_by: Option<crate::DriftFoundBy>,
    },
    /// ipq-ipam's delegate found its range exhausted while ipq held addresses of it.
    IpamExhausted {
        network: String,
        container_id: String,
        #[serde(flatten)]
        answer: ExhaustedAnswer,
    },
    /// `n` events were dropped before this subscriber could read them.
    Lost { n: u64 },
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
