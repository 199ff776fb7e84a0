//! One spelling per name: the string form strum derives (labels, logs, tables, parsing) is the
//! one serde writes on the wire and in the journal, for every variant.

use ipq_api::OnExhausted;
use serde::Serialize;
use strum::VariantArray as _;

use crate::{
    api::model::ErrorCode,
    config::EarlyReusePolicy,
    hygiene::{FlushMethod, Step, Trigger},
    registry::{ConflictKind, Source, StateName},
};

fn assert_one_spelling<T: Serialize + Copy + std::fmt::Debug + Into<&'static str>>(all: &[T]) {
    for v in all {
        let wire = serde_json::to_value(v).expect("serializes");
        let derived: &'static str = (*v).into();
        assert_eq!(wire, derived, "{v:?}: serde and strum disagree");
    }
}

#[test]
fn derived_string_forms_are_the_wire_forms() {
    assert_one_spelling(&[
        StateName::Free,
        StateName::Active,
        StateName::Draining,
        StateName::Quarantined,
    ]);
    assert_one_spelling(&[Source::Cni, Source::Api, Source::Netlink]);
    assert_one_spelling(ConflictKind::VARIANTS);
    assert_one_spelling(EarlyReusePolicy::VARIANTS);
    assert_one_spelling(OnExhausted::VARIANTS);
    assert_one_spelling(&[Trigger::HolderGone, Trigger::NewHolder]);
    assert_one_spelling(&[FlushMethod::Dump, FlushMethod::Kernel]);
    assert_one_spelling(Step::VARIANTS);
    assert_one_spelling(&[
        ErrorCode::BadRequest,
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::UnknownInterface,
        ErrorCode::Refused,
        ErrorCode::NotHolder,
        ErrorCode::NotReleasable,
        ErrorCode::RegistryFull,
        ErrorCode::Forbidden,
        ErrorCode::MethodNotAllowed,
        ErrorCode::NotReady,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
    ]);
}

#[test]
fn names_parse_back_and_free_is_never_a_held_state() {
    for name in ["active", "draining", "quarantined"] {
        let state = StateName::parse_held(name).expect(name);
        assert_eq!(state.as_ref(), name);
        assert_eq!(state.entry().map(StateName::from), Some(state));
    }
    assert_eq!(StateName::parse_held("free"), None);
    assert_eq!(StateName::parse_held("Active"), None);
    assert_eq!(StateName::Free.entry(), None);
    for &policy in EarlyReusePolicy::VARIANTS {
        assert_eq!(policy.as_ref().parse(), Ok(policy));
    }
    assert!("fence_old".parse::<EarlyReusePolicy>().is_err());
    for &policy in OnExhausted::VARIANTS {
        assert_eq!(policy.to_string().parse(), Ok(policy));
    }
    assert!("release_quietest".parse::<OnExhausted>().is_err());
}

/// What of an attachment went is spelled in an `attachment_lost` event as the metric labels it,
/// and its hook as the metric's `hook` label (`none` for a pin of a map or program).
#[test]
fn a_lost_attachment_is_spelled_as_its_metric_labels_it() {
    use crate::{datapath::attach::Lost, metrics, paths::AttachPoint};
    use ipq_api::{EventHook, LostPart};
    for &lost in Lost::VARIANTS {
        assert_eq!(<&str>::from(LostPart::from(lost)), lost.as_ref());
    }
    for &point in AttachPoint::VARIANTS {
        assert_eq!(
            EventHook::from(point.hook()).as_ref(),
            metrics::hook_label(point)
        );
    }
    assert_eq!(EventHook::NoHook.as_ref(), "none");
}

/// An interface's hooks in `/v1/status` are named as the log and `ipq status` name them.
#[test]
fn an_attached_hook_is_spelled_as_its_hook_name() {
    use crate::{datapath::attach::Mechanism, paths::AttachPoint};
    for by in [Mechanism::Tcx, Mechanism::Netlink, Mechanism::Xdp] {
        for &point in AttachPoint::VARIANTS {
            assert_eq!(by.attached_hook(point).as_ref(), by.hook_name(point));
        }
    }
}
