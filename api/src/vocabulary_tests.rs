//! The API's names keep their spellings byte for byte, every variant of each (checked against
//! what strum lists), and read back from them where the API parses them.

use strum::VariantArray;

use crate::{ConflictKind, EarlyReusePolicy, MapWrite, Protection, StateName};

#[test]
fn state_names() {
    let spelled: Vec<&str> = StateName::VARIANTS.iter().map(|s| s.as_str()).collect();
    assert_eq!(spelled, ["free", "active", "draining", "quarantined"]);
    for state in StateName::VARIANTS {
        assert_eq!(state.as_str().parse(), Ok(*state));
        assert_eq!(state.to_string(), state.as_str());
    }
    assert!("Active".parse::<StateName>().is_err());
}

#[test]
fn conflict_kinds() {
    assert_eq!(ConflictKind::ALL, ConflictKind::VARIANTS);
    let spelled: Vec<&str> = ConflictKind::ALL.iter().map(|k| k.as_str()).collect();
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
    assert_eq!(EarlyReusePolicy::ALL, EarlyReusePolicy::VARIANTS);
    let spelled: Vec<&str> = EarlyReusePolicy::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(spelled, ["fence-old", "refuse-new", "observe"]);
    for policy in EarlyReusePolicy::ALL {
        assert_eq!(policy.as_str().parse(), Ok(policy));
    }
    assert!("fence_old".parse::<EarlyReusePolicy>().is_err());
}

/// What the agent says of an interface is spelled as before on the wire, and a state of a newer
/// agent reads as `unknown` rather than failing the whole answer.
#[test]
fn protections() {
    let spelled: Vec<&str> = Protection::VARIANTS.iter().map(|p| p.as_str()).collect();
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
        assert_eq!(json, format!("\"{}\"", protection.as_str()));
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
    let spelled: Vec<&str> = MapWrite::VARIANTS.iter().map(|w| w.as_str()).collect();
    assert_eq!(spelled, ["update", "delete", "unknown"]);
    for write in MapWrite::VARIANTS {
        let json = serde_json::to_string(write).unwrap();
        assert_eq!(json, format!("\"{}\"", write.as_str()));
        assert_eq!(serde_json::from_str::<MapWrite>(&json).unwrap(), *write);
    }
    assert_eq!(
        serde_json::from_str::<MapWrite>("\"truncate\"").unwrap(),
        MapWrite::Unknown
    );
}
