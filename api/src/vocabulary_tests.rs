//! The API's names keep their spellings byte for byte, every variant of each (checked against
//! what strum lists), and read back from them where the API parses them.

use strum::VariantArray;

use crate::{
    Attachment, ConflictKind, ConflictOutcome, ConntrackFlush, DriftFoundBy, EarlyReusePolicy,
    HoldRelease, HygieneTrigger, MapWrite, Protection, PublishState, RecoveredFrom, StateName,
    TcAttachMode,
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
