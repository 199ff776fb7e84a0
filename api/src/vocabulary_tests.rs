//! The API's names keep their spellings byte for byte, every variant of each (checked against
//! what strum lists), and read back from them where the API parses them.

use ipq_common::{
    addr::AddrState,
    counters::{Action, Hook, Reason},
    names,
};
use strum::VariantArray;

use crate::{
    AttachedHook, Attachment, CheckedMap, ConflictKind, ConflictOutcome, ConntrackFlush,
    DriftFoundBy, EarlyReusePolicy, EntryState, EventHook, HoldRelease, HygieneTrigger, LostPart,
    MapWrite, OnExhausted, Protection, PublishState, RecoveredFrom, SampleAction, SampleReason,
    StateName, TcAttachMode,
};

#[test]
fn state_names() {
    let spelled: Vec<&str> = StateName::VARIANTS.iter().map(|s| s.as_ref()).collect();
    assert_eq!(spelled, ["free", "active", "draining", "quarantined"]);
    for state in StateName::VARIANTS {
        assert_eq!(state.as_ref().parse(), Ok(*state));
        assert_eq!(state.to_string(), state.as_ref());
    }
    assert!("Active".parse::<StateName>().is_err());
}

#[test]
fn conflict_kinds() {
    let spelled: Vec<&str> = ConflictKind::VARIANTS.iter().map(|k| k.as_ref()).collect();
    assert_eq!(
        spelled,
        [
            "early_reuse",
            "reuse_in_cooldown",
            "duplicate_source",
            "remote_claim"
        ]
    );
}

#[test]
fn early_reuse_policies() {
    let spelled: Vec<&str> = EarlyReusePolicy::VARIANTS
        .iter()
        .map(|p| p.as_ref())
        .collect();
    assert_eq!(spelled, ["fence-old", "refuse-new", "observe"]);
    for &policy in EarlyReusePolicy::VARIANTS {
        assert_eq!(policy.as_ref().parse(), Ok(policy));
    }
    assert!("fence_old".parse::<EarlyReusePolicy>().is_err());
}

/// What the agent says of an interface is spelled as before on the wire, and a state of a newer
/// agent reads as `unknown` rather than failing the whole answer.
#[test]
fn protections() {
    let spelled: Vec<&str> = Protection::VARIANTS.iter().map(|p| p.as_ref()).collect();
    assert_eq!(
        spelled,
        [
            "attaching",
            "protected",
            "repairing",
            "bypassed",
            "unverified",
            "failed",
            "unknown"
        ]
    );
    for protection in Protection::VARIANTS {
        let json = serde_json::to_string(protection).unwrap();
        assert_eq!(json, format!("\"{}\"", protection.as_ref()));
        assert_eq!(
            serde_json::from_str::<Protection>(&json).unwrap(),
            *protection
        );
    }
    assert_eq!(
        serde_json::from_str::<Protection>("\"shielded\"").unwrap(),
        Protection::Unknown
    );
    assert!(Protection::Protected.is_protected());
    assert!(!Protection::Bypassed.is_protected());
    assert!(!Protection::Unverified.is_protected());
}

/// A pending write's operation: its spelling is its serde form and the metric's label; a newer
/// agent's operation reads as `unknown`.
#[test]
fn map_writes() {
    let spelled: Vec<&str> = MapWrite::VARIANTS.iter().map(|w| w.as_ref()).collect();
    assert_eq!(spelled, ["update", "delete", "unknown"]);
    for write in MapWrite::VARIANTS {
        let json = serde_json::to_string(write).unwrap();
        assert_eq!(json, format!("\"{}\"", write.as_ref()));
        assert_eq!(serde_json::from_str::<MapWrite>(&json).unwrap(), *write);
    }
    assert_eq!(
        serde_json::from_str::<MapWrite>("\"truncate\"").unwrap(),
        MapWrite::Unknown
    );
}

/// Every variant of `T` is written as its strum spelling, reads back as itself, and a value a
/// newer agent may send reads as `unknown`.
fn assert_wire_names<T>(newer: &str, unknown: T, spelled: &[&str])
where
    T: VariantArray + Copy + PartialEq + std::fmt::Debug + serde::Serialize,
    T: serde::de::DeserializeOwned + Into<&'static str> + std::fmt::Display,
{
    let derived: Vec<&str> = T::VARIANTS.iter().map(|v| (*v).into()).collect();
    assert_eq!(derived, spelled);
    for variant in T::VARIANTS {
        let json = serde_json::to_string(variant).unwrap();
        assert_eq!(json, format!("\"{variant}\""), "{variant:?}");
        assert_eq!(serde_json::from_str::<T>(&json).unwrap(), *variant);
    }
    let newer = serde_json::to_string(newer).unwrap();
    assert_eq!(serde_json::from_str::<T>(&newer).unwrap(), unknown);
}

/// The names the agent reports its own doings in keep the spellings they had as strings.
#[test]
fn agent_names() {
    assert_wire_names(
        "ebpf-magic",
        TcAttachMode::Unknown,
        &["tcx", "netlink", "netlink-then-tcx", "unknown"],
    );
    assert_wire_names(
        "xdp+tcx",
        Attachment::Unknown,
        &["tcx", "netlink", "xdp", "tcx+netlink", "unknown"],
    );
    assert_wire_names(
        "netkit-primary",
        AttachedHook::Unknown,
        &[
            "tc-ingress",
            "tc-egress",
            "tcx-ingress",
            "tcx-egress",
            "xdp",
            "unknown",
        ],
    );
    assert_wire_names(
        "backup",
        RecoveredFrom::Unknown,
        &["journal", "pinned_maps", "unknown"],
    );
    assert_wire_names(
        "operator",
        HygieneTrigger::Unknown,
        &["holder_gone", "new_holder", "unknown"],
    );
    assert_wire_names(
        "zone",
        ConntrackFlush::Unknown,
        &["dump", "kernel", "unknown"],
    );
    assert_wire_names(
        "fenced_both",
        ConflictOutcome::Unknown,
        &[
            "fenced_old",
            "claimed",
            "refused_new",
            "blocked_new",
            "observed",
            "dropped",
            "reported",
            "unknown",
        ],
    );
    assert_wire_names(
        "never",
        HoldRelease::Unknown,
        &["after the quarantine", "now", "failing", "unknown"],
    );
    assert_wire_names(
        "guessed",
        DriftFoundBy::Unknown,
        &["reported_write", "comparison", "unknown"],
    );
    assert_wire_names(
        "throttled",
        PublishState::Unknown,
        &["starting", "published", "pending", "failing", "unknown"],
    );
}

/// The names of events and of the datapath's answers keep the spellings they had as strings.
#[test]
fn event_names() {
    assert_wire_names(
        "tcx_ingress",
        EventHook::Unknown,
        &["tc_ingress", "tc_egress", "xdp", "none", "unknown"],
    );
    assert_wire_names(
        "spoofed",
        SampleReason::Unknown,
        &[
            "fenced",
            "duplicate_source",
            "stale_traffic",
            "quarantined",
            "remote_claim",
            "unknown",
        ],
    );
    assert_wire_names(
        "redirected",
        SampleAction::Unknown,
        &["dropped", "observed", "reported", "unknown"],
    );
    assert_wire_names(
        "parked",
        EntryState::Unknown,
        &["active", "draining", "quarantined", "unknown"],
    );
    assert_wire_names(
        "program",
        LostPart::Unknown,
        &["qdisc", "filter", "link", "pin", "unknown"],
    );
    assert_wire_names(
        "IPQ_ROUTES",
        CheckedMap::Unknown,
        &[
            "IPQ_ADDRS",
            "IPQ_SLOTS",
            "IPQ_IFACES",
            "IPQ_QBLOOM",
            "unknown",
        ],
    );
    assert_wire_names(
        "evict-oldest",
        OnExhausted::Unknown,
        &["wait", "release-quietest", "unknown"],
    );
}

/// The kernel's names become the API's unchanged (a sample's hook, reason and action are
/// spelled as the metrics label the same packet), a raw value this build does not know is
/// `unknown`, and the maps are named as they are pinned.
#[test]
fn the_kernels_names_become_the_apis_unchanged() {
    for &hook in Hook::VARIANTS {
        assert_eq!(<&str>::from(EventHook::from(hook)), hook.as_ref());
        assert_eq!(EventHook::of_raw(hook as u32), EventHook::from(hook));
    }
    assert_eq!(EventHook::of_raw(Hook::COUNT), EventHook::Unknown);
    for &reason in Reason::VARIANTS {
        assert_eq!(<&str>::from(SampleReason::from(reason)), reason.as_ref());
        assert_eq!(
            SampleReason::of_raw(reason as u32),
            SampleReason::from(reason)
        );
    }
    assert_eq!(SampleReason::of_raw(Reason::COUNT), SampleReason::Unknown);
    for &action in Action::VARIANTS {
        assert_eq!(<&str>::from(SampleAction::from(action)), action.as_ref());
        assert_eq!(
            SampleAction::of_raw(action as u32),
            SampleAction::from(action)
        );
    }
    assert_eq!(SampleAction::of_raw(Action::COUNT), SampleAction::Unknown);
    for &state in AddrState::VARIANTS {
        assert_eq!(<&str>::from(EntryState::from(state)), state.as_ref());
        assert_eq!(
            <&str>::from(EntryState::from(state)),
            <&str>::from(StateName::from(state))
        );
    }
    assert_eq!(EntryState::of_raw(None), EntryState::Unknown);
    let maps: Vec<&str> = CheckedMap::VARIANTS
        .iter()
        .filter(|m| **m != CheckedMap::Unknown)
        .map(|m| m.as_ref())
        .collect();
    assert_eq!(
        maps,
        [
            names::MAP_ADDRS,
            names::MAP_SLOTS,
            names::MAP_IFACES,
            names::MAP_QFILTER
        ]
    );
}

/// `unknown` is how a newer agent's policy reads, never a setting.
#[test]
fn an_unknown_exhaustion_policy_is_not_a_setting() {
    assert_eq!(
        OnExhausted::parse_setting("release-quietest"),
        Some(OnExhausted::ReleaseQuietest)
    );
    assert_eq!(OnExhausted::parse_setting("wait"), Some(OnExhausted::Wait));
    assert_eq!(OnExhausted::parse_setting("unknown"), None);
    assert_eq!(OnExhausted::parse_setting("release_quietest"), None);
}

/// Error codes, which scripts and the CNI plugin branch on, keep their spellings whichever way
/// they are read (the wire, a label, a message).
#[test]
fn error_codes() {
    use crate::model::ErrorCode;
    let spelled: Vec<&str> = ErrorCode::VARIANTS.iter().map(|c| c.as_ref()).collect();
    assert_eq!(
        spelled,
        [
            "bad_request",
            "invalid_argument",
            "not_found",
            "unknown_interface",
            "refused",
            "not_holder",
            "not_releasable",
            "registry_full",
            "forbidden",
            "method_not_allowed",
            "not_ready",
            "unavailable",
            "internal",
            "unknown",
        ]
    );
    for code in ErrorCode::VARIANTS {
        assert_eq!(serde_json::to_string(code).unwrap(), format!("\"{code}\""));
        assert_eq!(<&str>::from(*code), code.as_ref());
    }
}

/// An error answer carrying a code a newer agent added still parses, with its message: a
/// client (the CLI, ipq-cni during a rolling upgrade) shows why instead of failing to read it.
#[test]
fn a_newer_agents_error_code_reads_as_unknown_with_its_message() {
    use crate::model::{ErrorCode, ErrorResponse};
    let body = r#"{"error":{"code":"quota_exceeded","message":"10.0.0.1: over quota"}}"#;
    let answer: ErrorResponse = serde_json::from_str(body).unwrap();
    assert_eq!(answer.error.code, ErrorCode::Unknown);
    assert_eq!(answer.error.message, "10.0.0.1: over quota");
    assert_eq!(ErrorCode::Unknown.http_status(), 500);
}

/// The roles a refusal names (`needs`), spelled one way on the wire and in messages; one a
/// newer agent adds reads as `unknown`, the refusal still readable; an older agent's refusal
/// without `needs` reads as none.
#[test]
fn roles() {
    use crate::model::{ErrorResponse, Role};
    let spelled: Vec<&str> = Role::VARIANTS.iter().map(|r| r.as_ref()).collect();
    assert_eq!(spelled, ["read", "admin", "root", "unknown"]);
    for role in Role::VARIANTS {
        assert_eq!(serde_json::to_string(role).unwrap(), format!("\"{role}\""));
    }
    assert!(Role::Read < Role::Admin && Role::Admin < Role::Root);
    let newer = r#"{"error":{"code":"forbidden","message":"m","needs":"auditor"}}"#;
    let answer: ErrorResponse = serde_json::from_str(newer).unwrap();
    assert_eq!(answer.error.needs, Some(Role::Unknown));
    let older = r#"{"error":{"code":"forbidden","message":"m"}}"#;
    let answer: ErrorResponse = serde_json::from_str(older).unwrap();
    assert_eq!(answer.error.needs, None);
}
