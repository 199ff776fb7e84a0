//! What a transition asks the rest of the agent to do: datapath map writes, events, conflicts
//! and metrics. The registry performs no I/O; its owner applies these in order.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::AddrEntry;
use serde::{Deserialize, Serialize};

use super::entry::datapath_entry;
pub use ipq_api::ConflictKind;

use super::types::{AddrRecord, Holder, MonoNs, StateName};
use crate::config::EarlyReusePolicy;

/// One recorded conflict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    pub kind: ConflictKind,
    pub addr: IpAddr,
    /// The holder that had the address (for `reuse_in_cooldown`: the gone one).
    pub old: Option<Holder>,
    /// The claimant, or the interface the duplicate source came from; `None` for a remote claim.
    pub new: Option<Holder>,
    /// The `on_early_reuse` policy in force.
    pub policy: EarlyReusePolicy,
    /// Monotonic ns.
    pub at: MonoNs,
}

/// One thing for the registry's owner to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Write the datapath entry of `addr` (key `AddrKey::from(addr)`), preserving the
    /// kernel-written fields (`last_stale_ns`, `last_sample_ns`) of an existing entry.
    Upsert { addr: IpAddr, entry: AddrEntry },
    /// Delete the datapath entry of `addr`.
    Remove { addr: IpAddr },
    /// A conflict to count, log and publish.
    Conflict(Box<Conflict>),
    /// For the event feed: `addr` went from `from` to `to`; `holder` is the live holder after
    /// it (a change of holder within Active is reported as `active → active`).
    Transition {
        addr: IpAddr,
        from: StateName,
        to: StateName,
        holder: Option<Holder>,
    },
    /// A quarantine ended after `quarantined_for_ns` (the quarantine-duration histogram).
    Released {
        addr: IpAddr,
        quarantined_for_ns: u64,
    },
    /// Another machine announced `addr` while `holder` (Active, naming its pod) has it: ask
    /// the API server whether the pod is still there, and hand the answer to
    /// [`Lifecycle::remote_claim_answered`](super::Lifecycle::remote_claim_answered).
    AskAboutHolder { addr: IpAddr, holder: Holder },
}

impl Effect {
    pub fn addr(&self) -> IpAddr {
        match self {
            Self::Upsert { addr, .. }
            | Self::Remove { addr }
            | Self::Transition { addr, .. }
            | Self::Released { addr, .. }
            | Self::AskAboutHolder { addr, .. } => *addr,
            Self::Conflict(c) => c.addr,
        }
    }
}

/// Applies the map writes among `effects` to `mirror`: what the datapath map holds after the
/// owner performed them (ignoring the kernel-written fields).
pub fn apply_to_mirror<'a>(
    mirror: &mut BTreeMap<IpAddr, AddrEntry>,
    effects: impl IntoIterator<Item = &'a Effect>,
) {
    for effect in effects {
        match effect {
            Effect::Upsert { addr, entry } => {
                mirror.insert(*addr, *entry);
            }
            Effect::Remove { addr } => {
                mirror.remove(addr);
            }
            Effect::Conflict(_)
            | Effect::Transition { .. }
            | Effect::Released { .. }
            | Effect::AskAboutHolder { .. } => {}
        }
    }
}

/// The effects that take the datapath and the event feed from `before` to `after` for one
/// address: a map write when the entry changes, a transition when the state or the holder does.
pub(crate) fn diff(
    addr: IpAddr,
    before: Option<&AddrRecord>,
    after: Option<&AddrRecord>,
    out: &mut Vec<Effect>,
) {
    let old_entry = before.map(datapath_entry);
    let new_entry = after.map(datapath_entry);
    match (old_entry, new_entry) {
        (Some(_), None) => out.push(Effect::Remove { addr }),
        (old, Some(entry)) if old != Some(entry) => out.push(Effect::Upsert { addr, entry }),
        _ => {}
    }
    let name = |r: Option<&AddrRecord>| r.map_or(StateName::Free, AddrRecord::state);
    let holder = |r: Option<&AddrRecord>| r.and_then(|r| r.status.holder()).map(|h| h.ifindex);
    let (from, to) = (name(before), name(after));
    if from != to || holder(before) != holder(after) {
        out.push(Effect::Transition {
            addr,
            from,
            to,
            holder: after.and_then(|r| r.status.holder()).cloned(),
        });
    }
}
