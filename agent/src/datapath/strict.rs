//! Which of two copies of an address's entry enforces more, for where two copies disagree and
//! nothing says which is the truth: `IPQ_ADDRS` against `IPQ_SLOTS` when the table opens, the
//! pinned maps against the journal at start-up. Either copy may have been written by another
//! tool (a raw `bpf()` write that unfences an address); the stricter one is kept, so that a
//! tampered map can loosen nothing, and the disagreement is reported.
//!
//! The order: no entry (free) < an observe-only or observed namespace's entry (it drops
//! nothing, or only stale traffic) < a live holder's
//! entry < a quarantined entry (every packet to the address dropped at the uplinks) < an entry
//! that fences an interface (that interface's packets dropped both ways). A tie keeps the copy
//! the caller trusts by default.

use ipq_common::addr::{
    AddrEntry, AddrState, FLAG_OBSERVE_NAMESPACE, FLAG_OBSERVE_ONLY, NO_IFINDEX,
};

/// How much `entry` enforces (see the module's order).
pub fn strictness(entry: Option<&AddrEntry>) -> u8 {
    let Some(entry) = entry else {
        return 0;
    };
    if entry.flags & (FLAG_OBSERVE_ONLY | FLAG_OBSERVE_NAMESPACE) != 0 {
        return 1;
    }
    if entry.fenced_ifindex != NO_IFINDEX {
        return 4;
    }
    match entry.state() {
        Some(AddrState::Quarantined) => 3,
        Some(AddrState::Active | AddrState::Draining) => 2,
        // A state this build does not know enforces nothing it can tell.
        None => 1,
    }
}

/// Whether `other` enforces more than `trusted` (a tie keeps `trusted`).
pub fn stricter(other: Option<&AddrEntry>, trusted: Option<&AddrEntry>) -> bool {
    strictness(other) > strictness(trusted)
}

/// One line for an entry, as reports of a disagreement show it.
pub fn describe(entry: Option<&AddrEntry>) -> String {
    let Some(entry) = entry else {
        return "free (no entry)".to_owned();
    };
    let state = ipq_api::EntryState::of_raw(entry.state());
    let mut line = format!("{state} holder if{}", entry.holder_ifindex);
    if entry.fenced_ifindex != NO_IFINDEX {
        line.push_str(&format!(" fenced if{}", entry.fenced_ifindex));
    } else {
        line.push_str(" unfenced");
    }
    if entry.flags & FLAG_OBSERVE_ONLY != 0 {
        line.push_str(" observe-only");
    }
    if entry.flags & FLAG_OBSERVE_NAMESPACE != 0 {
        line.push_str(" observed namespace");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_over_unfenced_quarantined_over_free() {
        let active = AddrEntry::new(AddrState::Active, 7, 1);
        let fenced = active.with_fenced(7);
        let quarantined = AddrEntry::new(AddrState::Quarantined, NO_IFINDEX, 1);
        let mut observed = fenced;
        observed.flags |= FLAG_OBSERVE_ONLY;
        assert!(stricter(Some(&fenced), Some(&active)));
        assert!(!stricter(Some(&active), Some(&fenced)));
        assert!(stricter(Some(&quarantined), None));
        assert!(stricter(Some(&quarantined), Some(&active)));
        assert!(stricter(Some(&fenced), Some(&quarantined)));
        assert!(stricter(Some(&active), Some(&observed)));
        let mut namespace_observed = fenced;
        namespace_observed.flags |= FLAG_OBSERVE_NAMESPACE;
        assert!(stricter(Some(&active), Some(&namespace_observed)));
        assert!(describe(Some(&namespace_observed)).ends_with(" observed namespace"));
        assert!(
            !stricter(Some(&active), Some(&active)),
            "a tie keeps the trusted copy"
        );
        assert_eq!(describe(Some(&fenced)), "active holder if7 fenced if7");
        assert_eq!(describe(None), "free (no entry)");
    }
}
