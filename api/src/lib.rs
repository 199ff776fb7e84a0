//! ipq's local API: what `/v1` on the agent's unix socket accepts and answers, the names it
//! speaks in, and a client. The agent serves these types; the `ipq` CLI, `ipq-cni` and
//! `ipq-ipam` send them. Nothing here knows about eBPF or the registry.

mod agent_names;
pub mod client;
pub mod echo;
mod event_names;
mod holder;
pub mod mac;
pub mod model;
mod vocabulary;
#[cfg(test)]
mod vocabulary_tests;

pub use agent_names::{
    AttachedHook, Attachment, ConflictOutcome, ConntrackFlush, DriftFoundBy, HoldRelease,
    HygieneTrigger, PublishState, RecoveredFrom, TcAttachMode,
};
pub use event_names::{CheckedMap, EntryState, EventHook, LostPart, SampleAction, SampleReason};
pub use holder::{Holder, PodRef};

/// Where the agent serves the API unless told otherwise (`api_socket`).
pub const DEFAULT_SOCKET: &str = "/run/ipq/ipq.sock";
/// The agent's `state_dir` unless told otherwise; the CNI plugins spool under it.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/ipq";
pub use vocabulary::{
    ConflictKind, EarlyReusePolicy, MapWrite, OnExhausted, Protection, StateName,
};
