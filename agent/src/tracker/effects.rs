//! Where the registry's effects go ([`Sinks`]): datapath writes (the datapath writer, and the
//! entries written by hand that a registry write replaces), conflicts (counted, logged,
//! published), transitions for the event feed and for reuse hygiene, and the
//! quarantine-duration histogram. Each sink owns its state; the tracker hands them the core's
//! effects. The datapath entry of an address, its observe-only flag included, is always the
//! registry's own derivation ([`crate::registry::datapath_entry`]): nothing here adds to it.

use std::net::IpAddr;

use ipq_common::sample::ConflictSample;

use super::{break_glass::HandWritten, decide::Core, enforcer::Enforcer, observer::Observer};
use crate::{
    api::views::outcome_of,
    datapath::attach::Attacher,
    hygiene::Hygiene,
    registry::{AddrStatus, Effect, Holder, StateName},
};

/// The parts the registry's effects change, each the owner of its state.
pub(super) struct Sinks {
    /// The datapath's one writer.
    pub(super) enforcer: Enforcer,
    /// Entries written by hand behind the registry's back, until it changes them.
    pub(super) hand_written: HandWritten,
    /// Effects and samples made counters, feed entries and log lines.
    pub(super) observer: Observer,
    /// Reuse hygiene's jobs and last reports (inert until started).
    pub(super) hygiene: Hygiene,
}

impl Sinks {
    /// Hands each of `effects` to its sink; the claims that waited for room the removals freed
    /// are made (by the core) and handed on in turn.
    pub(super) fn apply(&mut self, core: &mut Core, effects: Vec<Effect>) {
        let mut freed = 0;
        for effect in effects {
            match effect {
                Effect::Upsert { addr, entry } => {
                    self.hand_written.forget(addr);
                    self.enforcer.write(addr, entry);
                }
                Effect::Remove { addr } => {
                    freed += 1;
                    self.hand_written.forget(addr);
                    self.enforcer.remove(addr);
                }
                Effect::Conflict(conflict) => {
                    let record = core.registry.records().get(conflict.addr);
                    let outcome = outcome_of(&conflict, record, core.config.mode);
                    self.observer.conflict(&conflict, outcome);
                }
                Effect::Transition {
                    addr,
                    from,
                    to,
                    holder,
                } => {
                    self.hygiene_on_transition(core, addr, from, to, holder.as_ref());
                    self.observer.transition(addr, from, to, holder);
                }
                Effect::Released {
                    addr,
                    quarantined_for_ns,
                } => self.observer.released(addr, quarantined_for_ns),
            }
        }
        if freed > 0 {
            let claimed = core.retry_waiting(freed);
            if !claimed.is_empty() {
                self.apply(core, claimed);
            }
        }
    }

    /// A transition of `addr` from `from` into `to` with `holder` live after it: when the holder
    /// is gone or new, the hygiene worker gets a job; it cleans only where the core says the
    /// datapath drops a conflict ([`Core::cleans`]).
    fn hygiene_on_transition(
        &mut self,
        core: &Core,
        addr: IpAddr,
        from: StateName,
        to: StateName,
        holder: Option<&Holder>,
    ) {
        let act = core.cleans(addr, from);
        let live = holder
            .filter(|_| matches!(to, StateName::Active | StateName::Draining))
            .map(|h| h.ifindex);
        self.hygiene
            .on_transition(addr, to == StateName::Quarantined, live, act);
        if to == StateName::Free {
            self.hygiene.forget(addr);
        }
    }

    /// Logs (rate-limited) and publishes one kernel sample, named by who the registry says
    /// holds (or held) its address and the interface it was seen on.
    pub(super) fn publish_sample(
        &mut self,
        core: &Core,
        attacher: &Attacher,
        sample: &ConflictSample,
    ) {
        let addr = sample.addr.to_ip();
        let holder = core.registry.records().get(addr).map(|r| match &r.status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        let seen_on = interface_name(core, attacher, sample.ifindex);
        self.observer.sample(sample, seen_on, holder);
    }
}

/// The name of interface `ifindex` as an event shows it: the node's, else the attacher's last
/// known, else `if<index>`.
fn interface_name(core: &Core, attacher: &Attacher, ifindex: u32) -> String {
    core.net
        .link_name(ifindex)
        .map(str::to_owned)
        .or_else(|| attacher.target(ifindex).map(|t| t.name.clone()))
        .unwrap_or_else(|| format!("if{ifindex}"))
}
