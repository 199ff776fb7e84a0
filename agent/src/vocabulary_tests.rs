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

/// Every variant of `T` spelled as `spelled`, one spelling whichever way it is read (a label's
/// `as_ref`, a log line's `Display`, a `&'static str`).
fn assert_spelled<T>(all: &[T], spelled: &[&str])
where
    T: Copy + std::fmt::Debug + std::fmt::Display + AsRef<str> + Into<&'static str>,
{
    let derived: Vec<&'static str> = all.iter().map(|v| (*v).into()).collect();
    assert_eq!(derived, spelled);
    for (v, name) in all.iter().zip(derived) {
        assert_eq!(v.as_ref(), name, "{v:?}");
        assert_eq!(v.to_string(), name, "{v:?}");
    }
}

/// The names whose hand-written `as_str` gave way to strum's derives keep the spellings they
/// had: metric labels (dashboards and alerts read them), pin names (restarts and upgrades find
/// pins by them), log words.
#[test]
fn derived_names_keep_their_spellings() {
    use crate::{
        addr_class::NotWorkload,
        datapath::attach::{tc_filter::Direction, Lost, Mechanism, TcMode},
        metrics::LostAt,
        paths::AttachPoint,
        queues::Queue,
    };
    assert_spelled(
        &[Trigger::HolderGone, Trigger::NewHolder],
        &["holder_gone", "new_holder"],
    );
    assert_spelled(
        &[FlushMethod::Dump, FlushMethod::Kernel],
        &["dump", "kernel"],
    );
    assert_spelled(Step::VARIANTS, &["conntrack", "neighbours", "announce"]);
    assert_spelled(AttachPoint::VARIANTS, &["tcx-ingress", "tcx-egress", "xdp"]);
    assert_spelled(
        Queue::VARIANTS,
        &[
            "netlink_events",
            "tc_notices",
            "attach_reports",
            "hygiene_reports",
            "hygiene_jobs",
            "journal_commits",
            "map_writes",
            "reported_keys",
        ],
    );
    assert_spelled(
        &[Source::Cni, Source::Api, Source::Netlink],
        &["cni", "api", "netlink"],
    );
    assert_spelled(
        &[TcMode::Tcx, TcMode::Netlink, TcMode::NetlinkThenTcx],
        &["tcx", "netlink", "netlink-then-tcx"],
    );
    assert_spelled(
        &[Mechanism::Tcx, Mechanism::Netlink, Mechanism::Xdp],
        &["tcx", "netlink", "xdp"],
    );
    assert_spelled(
        &[Direction::Ingress, Direction::Egress],
        &["ingress", "egress"],
    );
    assert_spelled(Lost::VARIANTS, &["qdisc", "filter", "link", "pin"]);
    assert_spelled(
        &[LostAt::Log, LostAt::Api, LostAt::Queue],
        &["log", "api", "queue"],
    );
    assert_spelled(
        &[
            NotWorkload::Unspecified,
            NotWorkload::Loopback,
            NotWorkload::Multicast,
            NotWorkload::Broadcast,
            NotWorkload::LinkLocal,
        ],
        &[
            "unspecified",
            "loopback",
            "multicast",
            "broadcast",
            "link-local",
        ],
    );
}
