//! A repair job ([`super::JobKind::Repair`]): the kernel announced that something ipq's program
//! on an interface depends on went. The worker looks at each hook as the kernel has it, and
//! attaches again only where ipq's program is no longer there, so a notice caused by ipq
//! itself (an upgrade removing its filter once the TCX link holds the hook) repairs nothing
//! and counts nothing.

use std::io;

use super::{
    cotenant::{self, Ahead},
    pins::Attached,
    tc_filter::{self, Direction, Place},
    AttachError, Hooked, Job, JobReport, Mechanism,
};
use crate::{
    datapath::held_pins::{self, TcxPlace},
    paths::{AttachPoint, PinLayout},
};

/// What a hook needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fix {
    /// ipq's program is not on the hook: attach it as a first attach would.
    Attach,
    /// ipq's TCX link is attached but something was put before it: ipq's goes first again.
    MoveFirst,
}

/// What holds ipq's program on `point` of `ifindex` now (ipq's netlink filter, or the TCX or
/// XDP link the agent pinned, still attached and, for TCX, first), or what the hook needs.
fn in_place(
    layout: &PinLayout,
    ifindex: u32,
    point: AttachPoint,
) -> io::Result<Result<Mechanism, Fix>> {
    let path = layout.link(ifindex, point);
    let Some(direction) = Direction::of(point) else {
        // A detached link is replaced; a link running another program gets ipq's swapped
        // back in (the attach reuses the pinned link).
        let attached = held_pins::link_state(&path).map_or_else(
            || path.exists(),
            |state| state == held_pins::LinkState::Attached,
        );
        return Ok(attached.then_some(Mechanism::Xdp).ok_or(Fix::Attach));
    };
    if tc_filter::place(ifindex, direction)? == Place::Ipq {
        // ipq's filter in a foreign `ingress` qdisc's one block does not run on egress: only
        // under clsact is it in place.
        return Ok(match tc_filter::ingress_qdisc(ifindex)? {
            tc_filter::IngressQdisc::Foreign(_) => Err(Fix::Attach),
            _ => Ok(Mechanism::Netlink),
        });
    }
    Ok(match held_pins::tcx_place(&path, ifindex, point) {
        Some(TcxPlace::First) => Ok(Mechanism::Tcx),
        // Programs ahead that hand every packet on are left where they are.
        Some(TcxPlace::Behind) if hands_on(&path, ifindex, point) => Ok(Mechanism::Tcx),
        Some(TcxPlace::Behind) => Err(Fix::MoveFirst),
        // Attaching reuses the pinned link: ipq's program is swapped back into it.
        Some(TcxPlace::Absent | TcxPlace::Replaced) => Err(Fix::Attach),
        // Not held (an earlier agent's pin this one has not taken over yet): as the pin says.
        None if path.exists() => Ok(Mechanism::Tcx),
        None => Err(Fix::Attach),
    })
}

/// Whether the programs before ipq's TCX link at `path` hand the interface's addresses'
/// packets on ([`cotenant::judge`]).
fn hands_on(path: &std::path::Path, ifindex: u32, point: AttachPoint) -> bool {
    held_pins::tcx_programs_ahead(path, ifindex, point).is_some_and(|ids| {
        let ahead: Vec<Ahead> = ids.into_iter().map(Ahead::Program).collect();
        cotenant::judge(ifindex, point, &ahead).hands_on()
    })
}

/// Looks at every hook of `job`'s interface and calls `fix` for each where ipq's program is
/// missing or no longer first.
pub(super) fn run(
    job: Job,
    layout: &PinLayout,
    mut fix: impl FnMut(AttachPoint, Fix) -> Result<Hooked, AttachError>,
) -> JobReport {
    let mut hooks = Vec::new();
    let mut found_missing = Vec::new();
    for &point in job.role.points() {
        let result = match in_place(layout, job.ifindex, point) {
            Ok(Ok(by)) => Ok(Hooked {
                how: Attached::Reused,
                by,
            }),
            Ok(Err(needed)) => {
                found_missing.push(point);
                fix(point, needed)
            }
            // The report names the hook (as the mode attaches it) ahead of the error.
            Err(e) => Err(AttachError::io("looking at the hook".to_owned(), &e)),
        };
        hooks.push((point, result));
    }
    JobReport {
        job,
        hooks,
        found_missing,
        ahead: Vec::new(),
    }
}
