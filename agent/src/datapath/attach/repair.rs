//! A repair job ([`super::JobKind::Repair`]): the kernel announced that something ipq's program
//! on an interface depends on went. The worker looks at each hook as the kernel has it, and
//! attaches again only where ipq's program is no longer there, so a notice caused by ipq
//! itself (an upgrade removing its filter once the TCX link holds the hook) repairs nothing
//! and counts nothing.

use std::io;

use super::{
    pins::Attached,
    tc_filter::{self, Direction, Place},
    Hooked, Job, JobReport, Mechanism,
};
use crate::{
    datapath::held_pins,
    paths::{AttachPoint, PinLayout},
};

/// What holds ipq's program on `point` of `ifindex` now, if anything does: ipq's netlink
/// filter, or the TCX or XDP link the agent pinned, still attached.
fn in_place(layout: &PinLayout, ifindex: u32, point: AttachPoint) -> io::Result<Option<Mechanism>> {
    let link_attached = || {
        let path = layout.link(ifindex, point);
        held_pins::link_attached(&path).unwrap_or_else(|| path.exists())
    };
    let direction = match point {
        AttachPoint::Xdp => return Ok(link_attached().then_some(Mechanism::Xdp)),
        AttachPoint::TcxIngress => Direction::Ingress,
        AttachPoint::TcxEgress => Direction::Egress,
    };
    if tc_filter::place(ifindex, direction)? == Place::Ipq {
        return Ok(Some(Mechanism::Netlink));
    }
    Ok(link_attached().then_some(Mechanism::Tcx))
}

/// Looks at every hook of `job`'s interface and calls `attach` for each that lacks ipq's
/// program.
pub(super) fn run(
    job: Job,
    layout: &PinLayout,
    mut attach: impl FnMut(AttachPoint) -> Result<Hooked, String>,
) -> JobReport {
    let mut hooks = Vec::new();
    let mut found_missing = Vec::new();
    for &point in job.role.points() {
        let result = match in_place(layout, job.ifindex, point) {
            Ok(Some(by)) => Ok(Hooked {
                how: Attached::Reused,
                by,
            }),
            Ok(None) => {
                found_missing.push(point);
                attach(point)
            }
            Err(e) => Err(format!("looking at the {} hook: {e}", point.as_str())),
        };
        hooks.push((point, result));
    }
    JobReport {
        job,
        hooks,
        found_missing,
    }
}
