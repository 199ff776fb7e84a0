//! The verdict logic of DESIGN §2, as pure functions over a map entry. The kernel programs call
//! these after parsing; the agent's unit tests call them directly, so the decision table is
//! tested without a kernel as well as through `BPF_PROG_TEST_RUN`.

use crate::{
    addr::{AddrEntry, AddrState, FLAG_OBSERVE_NAMESPACE, FLAG_OBSERVE_ONLY, NO_IFINDEX},
    config::Mode,
    counters::{Action, Reason},
};

/// A workload interface `ifindex` sends a packet whose source (or announced ARP sender / NA
/// target) address has `entry`. Returns why it must not pass, if it must not.
#[inline(always)]
pub fn workload_sends(ifindex: u32, entry: &AddrEntry) -> Option<Reason> {
    if entry.fenced_ifindex != NO_IFINDEX && entry.fenced_ifindex == ifindex {
        return Some(Reason::Fenced);
    }
    match AddrState::from_repr(entry.state) {
        Some(AddrState::Active | AddrState::Draining) => {
            if entry.holder_ifindex == ifindex {
                None
            } else {
                Some(Reason::DuplicateSource)
            }
        }
        Some(AddrState::Quarantined) => Some(Reason::Quarantined),
        // A state this build does not know: written by a newer agent. Pass, as for any address
        // the datapath cannot judge.
        None => None,
    }
}

/// A packet for the address of `entry` leaves through workload interface `ifindex` (the
/// workload receives it).
#[inline(always)]
pub fn workload_receives(ifindex: u32, entry: &AddrEntry) -> Option<Reason> {
    if entry.fenced_ifindex != NO_IFINDEX && entry.fenced_ifindex == ifindex {
        return Some(Reason::Fenced);
    }
    match AddrState::from_repr(entry.state) {
        Some(AddrState::Quarantined) => Some(Reason::Quarantined),
        _ => None,
    }
}

/// A packet from another machine arrives on an uplink for the address of `entry`.
#[inline(always)]
pub fn uplink_receives(entry: &AddrEntry) -> Option<Reason> {
    match AddrState::from_repr(entry.state) {
        Some(AddrState::Quarantined) => Some(Reason::StaleTraffic),
        _ => None,
    }
}

/// Another machine announces (gratuitous ARP, ARP with its sender address, unsolicited NA or a
/// DAD probe) the address of `entry`: a remote claim when a holder here still has it.
#[inline(always)]
pub fn uplink_announces(entry: &AddrEntry) -> Option<Reason> {
    match AddrState::from_repr(entry.state) {
        Some(AddrState::Active | AddrState::Draining) => Some(Reason::RemoteClaim),
        _ => None,
    }
}

/// What a program does with a packet it has a reason about, in `mode`.
#[inline(always)]
pub fn action_for(mode: Mode, reason: Reason) -> Action {
    match (reason, mode) {
        (Reason::RemoteClaim, _) => Action::Reported,
        (_, Mode::Enforce) => Action::Dropped,
        (_, Mode::Observe) => Action::Observed,
    }
}

/// What a program does with a packet it has a reason about, for the address of `entry`:
/// conflicts between workloads on an observe-only address are counted, never dropped.
#[inline(always)]
pub fn action_for_entry(mode: Mode, reason: Reason, entry: &AddrEntry) -> Action {
    action_for_flags(mode, reason, entry.flags)
}

/// The one judgment for an address whose entry carries `flags`: an address of an observed
/// namespace ([`FLAG_OBSERVE_NAMESPACE`]) is judged as under `mode = observe`, whatever the
/// mode; otherwise [`action_for_address`] with its observe-only flag. The kernel programs reach
/// it through [`action_for_entry`], the agent with the registry's derivation of the flags.
#[inline(always)]
pub fn action_for_flags(mode: Mode, reason: Reason, flags: u32) -> Action {
    if flags & FLAG_OBSERVE_NAMESPACE != 0 {
        action_for(Mode::Observe, reason)
    } else {
        action_for_address(mode, reason, flags & FLAG_OBSERVE_ONLY != 0)
    }
}

/// The one judgment of observe versus drop, for an address that is `observe_only` (its early
/// reuse was let through) or not: the kernel programs reach it through [`action_for_entry`],
/// the agent with the registry's flag, so what the agent reports, counts and cleans always
/// matches what the datapath did.
#[inline(always)]
pub fn action_for_address(mode: Mode, reason: Reason, observe_only: bool) -> Action {
    let workload_conflict = matches!(reason, Reason::Fenced | Reason::DuplicateSource);
    if workload_conflict && observe_only {
        Action::Observed
    } else {
        action_for(mode, reason)
    }
}

#[cfg(test)]
mod tests {
    use strum::VariantArray as _;

    use super::*;

    const A: u32 = 10;
    const B: u32 = 11;
    const C: u32 = 12;

    fn entry(state: AddrState, holder: u32, fenced: u32) -> AddrEntry {
        AddrEntry::new(state, holder, 1).with_fenced(fenced)
    }

    #[test]
    fn holder_passes_and_others_are_duplicate_sources() {
        for state in [AddrState::Active, AddrState::Draining] {
            let e = entry(state, A, NO_IFINDEX);
            assert_eq!(workload_sends(A, &e), None);
            assert_eq!(workload_sends(B, &e), Some(Reason::DuplicateSource));
            assert_eq!(workload_receives(A, &e), None);
            assert_eq!(workload_receives(B, &e), None);
        }
    }

    #[test]
    fn fenced_interface_is_dropped_both_ways_and_holder_flows() {
        let e = entry(AddrState::Active, B, A);
        assert_eq!(workload_sends(A, &e), Some(Reason::Fenced));
        assert_eq!(workload_receives(A, &e), Some(Reason::Fenced));
        assert_eq!(workload_sends(B, &e), None);
        assert_eq!(workload_receives(B, &e), None);
        assert_eq!(workload_sends(C, &e), Some(Reason::DuplicateSource));
    }

    #[test]
    fn quarantined_address_is_stale_on_uplink_and_refused_on_workloads() {
        let e = entry(AddrState::Quarantined, NO_IFINDEX, NO_IFINDEX);
        assert_eq!(uplink_receives(&e), Some(Reason::StaleTraffic));
        assert_eq!(uplink_announces(&e), None);
        assert_eq!(workload_sends(A, &e), Some(Reason::Quarantined));
        assert_eq!(workload_receives(A, &e), Some(Reason::Quarantined));
    }

    #[test]
    fn live_address_is_claimed_remotely_not_stale() {
        for state in [AddrState::Active, AddrState::Draining] {
            let e = entry(state, A, NO_IFINDEX);
            assert_eq!(uplink_receives(&e), None);
            assert_eq!(uplink_announces(&e), Some(Reason::RemoteClaim));
        }
    }

    #[test]
    fn unknown_state_passes_everywhere() {
        let mut e = entry(AddrState::Active, A, NO_IFINDEX);
        e.state = 99;
        assert_eq!(workload_sends(B, &e), None);
        assert_eq!(workload_receives(B, &e), None);
        assert_eq!(uplink_receives(&e), None);
        assert_eq!(uplink_announces(&e), None);
    }

    #[test]
    fn observe_only_addresses_count_workload_conflicts_without_dropping() {
        let mut e = entry(AddrState::Active, A, B);
        e.flags = FLAG_OBSERVE_ONLY;
        for reason in [Reason::Fenced, Reason::DuplicateSource] {
            assert_eq!(
                action_for_entry(Mode::Enforce, reason, &e),
                Action::Observed
            );
        }
        assert_eq!(
            action_for_entry(Mode::Enforce, Reason::StaleTraffic, &e),
            Action::Dropped
        );
        e.flags = 0;
        assert_eq!(
            action_for_entry(Mode::Enforce, Reason::Fenced, &e),
            Action::Dropped
        );
    }

    #[test]
    fn the_agents_judgment_is_the_programs() {
        for mode in [Mode::Enforce, Mode::Observe] {
            for &reason in Reason::VARIANTS {
                for observe_only in [false, true] {
                    let mut e = entry(AddrState::Active, A, B);
                    e.flags = if observe_only { FLAG_OBSERVE_ONLY } else { 0 };
                    assert_eq!(
                        action_for_address(mode, reason, observe_only),
                        action_for_entry(mode, reason, &e),
                        "{mode:?} {reason:?} observe_only {observe_only}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_observed_namespaces_address_never_drops_whatever_the_mode_and_the_reason() {
        for mode in [Mode::Enforce, Mode::Observe] {
            for &reason in Reason::VARIANTS {
                for flags in [
                    FLAG_OBSERVE_NAMESPACE,
                    FLAG_OBSERVE_NAMESPACE | FLAG_OBSERVE_ONLY,
                ] {
                    let mut e = entry(AddrState::Quarantined, NO_IFINDEX, B);
                    e.flags = flags;
                    let action = action_for_entry(mode, reason, &e);
                    assert_eq!(
                        action,
                        action_for(Mode::Observe, reason),
                        "{mode:?} {reason:?}"
                    );
                    assert_ne!(action, Action::Dropped, "{mode:?} {reason:?}");
                    assert_eq!(action, action_for_flags(mode, reason, flags));
                }
            }
        }
        // Without the flag, enforce still drops what it drops.
        let e = entry(AddrState::Quarantined, NO_IFINDEX, B);
        assert_eq!(
            action_for_entry(Mode::Enforce, Reason::StaleTraffic, &e),
            Action::Dropped
        );
    }

    #[test]
    fn observe_mode_never_drops() {
        for &reason in Reason::VARIANTS {
            assert_ne!(action_for(Mode::Observe, reason), Action::Dropped);
        }
        assert_eq!(action_for(Mode::Enforce, Reason::Fenced), Action::Dropped);
        assert_eq!(action_for(Mode::Observe, Reason::Fenced), Action::Observed);
        assert_eq!(
            action_for(Mode::Enforce, Reason::RemoteClaim),
            Action::Reported
        );
    }
}
