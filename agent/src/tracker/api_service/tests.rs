//! The API's answers, through the tracker's dispatch: what a change is answered with, and
//! how the journal's save decides whether a success may be reported.

use std::{
    net::IpAddr,
    time::{Duration, SystemTime},
};

use tokio::sync::oneshot;

use super::refusal::refusal_at;
use crate::{
    api::{
        command::Command,
        model::{ClaimRequest, ClaimSource, ErrorCode, HolderSpec},
        views::TimeBase,
    },
    config::EarlyReusePolicy,
    registry::{Holder, RegistryError, StateName},
    tracker::{
        tests::{claim_saved_by, ip, tracker, tracker_with_journal_clock},
        Tracker,
    },
};

/// A claim for `lo` by a CNI attachment (container, ifname, network), or by no container.
fn claim_by(t: &mut Tracker, addr: &str, attachment: Option<(&str, &str, &str)>) {
    let (reply, mut answer) = oneshot::channel();
    let holder = match attachment {
        Some((container, ifname, network)) => HolderSpec {
            interface: "lo".into(),
            container_id: Some(container.into()),
            cni_ifname: Some(ifname.into()),
            network: Some(network.into()),
            ..HolderSpec::default()
        },
        None => HolderSpec {
            interface: "lo".into(),
            ..HolderSpec::default()
        },
    };
    let request = ClaimRequest {
        addresses: vec![ip(addr)],
        holder,
        source: ClaimSource::Cni,
    };
    t.handle(Command::Claim { request, reply })(Ok(()));
    futures::FutureExt::now_or_never(answer.try_recv().expect("answered"))
        .expect("answered without waiting for a flush")
        .expect("claimed");
}

#[test]
fn gc_drains_exactly_the_attachments_the_runtime_no_longer_lists() {
    use crate::api::model::{Attachment, GcRequest};
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    claim_by(&mut t, "10.0.0.1", Some(("a", "eth0", "net1")));
    claim_by(&mut t, "10.0.0.2", Some(("b", "eth0", "net1")));
    claim_by(&mut t, "10.0.0.3", Some(("a", "eth1", "net1")));
    claim_by(&mut t, "10.0.0.4", None);
    claim_by(&mut t, "10.0.0.5", Some(("c", "eth0", "net2")));
    let request = GcRequest {
        valid_attachments: vec![
            Attachment {
                container_id: "a".into(),
                ifname: "eth0".into(),
            },
            Attachment {
                container_id: "z".into(),
                ifname: "eth1".into(),
            },
        ],
        network: Some("net1".into()),
    };
    let (reply, mut answer) = oneshot::channel();
    t.handle(Command::Gc { request, reply })(Ok(()));
    let drained: Vec<IpAddr> = answer
        .try_recv()
        .unwrap()
        .expect("gc answered")
        .addresses
        .iter()
        .map(|v| v.address)
        .collect();
    // b is not listed; a is, but not with eth1. No container: not CNI's. net2: not this GC's.
    assert_eq!(drained, vec![ip("10.0.0.2"), ip("10.0.0.3")]);
    for (addr, state) in [
        ("10.0.0.1", StateName::Active),
        ("10.0.0.2", StateName::Draining),
        ("10.0.0.3", StateName::Draining),
        ("10.0.0.4", StateName::Active),
        ("10.0.0.5", StateName::Active),
    ] {
        assert_eq!(t.core.registry.records().state(ip(addr)), state, "{addr}");
    }
}

#[test]
fn a_claim_is_answered_unavailable_until_it_is_saved() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let (mut t, mut journal, journal_clock) =
        tracker_with_journal_clock(EarlyReusePolicy::FenceOld, &state);
    // The state directory vanishes: every save fails.
    std::fs::remove_dir_all(&state).unwrap();
    let error = claim_saved_by(&mut t, Some(&mut journal), "10.0.0.9").unwrap_err();
    assert_eq!(error.code(), ErrorCode::Unavailable);
    assert!(error.0.message.contains("journal"), "{}", error.0.message);
    assert_eq!(t.metrics.journal_write_failures.get(), 1);
    assert!(!journal.is_saved(t.core.registry.changes().generation()));

    // Once the directory is back, the retry saves it and the same claim is answered. (The
    // journal tries a failed rewrite again at most once a second, so a failing disk is not
    // hammered by every request.)
    std::fs::create_dir_all(&state).unwrap();
    let error = claim_saved_by(&mut t, Some(&mut journal), "10.0.0.9").unwrap_err();
    assert_eq!(
        error.code(),
        ErrorCode::Unavailable,
        "retried before the journal's retry time"
    );
    journal_clock.advance(crate::journal::RETRY_AFTER);
    let response =
        claim_saved_by(&mut t, Some(&mut journal), "10.0.0.9").expect("the claim, now durable");
    assert_eq!(response.addresses[0].state, StateName::Active);
    assert!(journal.is_saved(t.core.registry.changes().generation()));
    assert_eq!(t.metrics.journal_unsaved_seconds.get(), 0.0);
}

#[test]
fn a_refusal_names_the_address_the_holder_and_until_when() {
    let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let time = TimeBase::at(0, wall);
    let holder = Holder::new(7, "veth7").with_container_id("abc");
    let error = RegistryError::Refused {
        addr: "10.1.0.5".parse().unwrap(),
        holder: Box::new(holder.clone()),
        until: Some(30_000_000_000),
    };
    let api = refusal_at(&error, &time).0;
    assert_eq!(api.code, ErrorCode::Refused);
    assert_eq!(api.holder, Some(holder));
    assert_eq!(api.until.as_deref(), Some("2027-01-15T08:00:30.000Z"));
    assert!(api.message.contains("10.1.0.5"), "{}", api.message);
    assert!(api.message.contains("veth7"), "{}", api.message);
    assert!(
        api.message.contains("2027-01-15T08:00:30.000Z"),
        "{}",
        api.message
    );
}

#[test]
fn a_failed_change_is_answered_as_it_failed_whatever_the_journal_did() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    let (reply, mut answer) = oneshot::channel();
    t.handle(Command::Drain {
        addr: ip("10.0.0.8"),
        reply,
    })(Err("the disk is gone"));
    let error = answer.try_recv().unwrap().unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound);
    assert_eq!(error.0.address, Some(ip("10.0.0.8")));

    let (reply, mut answer) = oneshot::channel();
    t.handle(Command::Get {
        addr: ip("10.0.0.8"),
        reply,
    })(Ok(()));
    let error = answer.try_recv().unwrap().unwrap_err();
    assert_eq!(error.code(), ErrorCode::NotFound);
}

#[test]
fn a_drain_is_answered_with_the_address_as_it_is_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    claim_by(&mut t, "10.0.0.6", Some(("a", "eth0", "net1")));
    let (reply, mut answer) = oneshot::channel();
    t.handle(Command::Drain {
        addr: ip("10.0.0.6"),
        reply,
    })(Ok(()));
    let changed = answer.try_recv().unwrap().expect("drained");
    assert_eq!(changed.addresses.len(), 1);
    assert_eq!(changed.addresses[0].address, ip("10.0.0.6"));
    assert_eq!(changed.addresses[0].state, StateName::Draining);
    let holder = changed.addresses[0].holder.as_ref().expect("its holder");
    assert_eq!(holder.container_id(), Some("a"));
}
