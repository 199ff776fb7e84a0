//! One attach worker: a thread with its own handles on the loaded programs, opened from their
//! pins under `bpffs_dir/progs`, which turns jobs into attachments and reports each outcome.
//!
//! aya's program objects are not `Sync`: each worker owns its own handles, so workers never
//! share one and need no lock around an attach.

use std::sync::{mpsc, Arc, Mutex};

use aya::programs::{
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
    ProgramError, SchedClassifier, TcAttachType, Xdp,
};
use aya_obj::programs::XdpAttachType;
use ipq_common::names::{self, TC_FILTER_HANDLE, TC_FILTER_PRIORITY};
use log::{debug, warn};

use super::{
    pins::{self, Attached},
    tc_filter::{self, Direction, Place},
    Job, JobReport, Role, TcMode,
};
use crate::paths::{AttachPoint, PinLayout};

/// The programs one worker attaches, opened from their pins.
struct Programs {
    ingress: SchedClassifier,
    egress: SchedClassifier,
    xdp: Xdp,
}

impl Programs {
    fn open(layout: &PinLayout) -> Result<Self, ProgramError> {
        Ok(Self {
            ingress: SchedClassifier::from_pin(layout.program(names::PROG_TC_INGRESS))?,
            egress: SchedClassifier::from_pin(layout.program(names::PROG_TC_EGRESS))?,
            xdp: Xdp::from_pin(
                layout.program(names::PROG_XDP_UPLINK),
                XdpAttachType::Interface,
            )?,
        })
    }
}

/// Runs jobs from `jobs` until the sender is gone, reporting each on `reports`.
pub fn run(
    layout: PinLayout,
    mode: TcMode,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    reports: tokio::sync::mpsc::UnboundedSender<JobReport>,
) {
    let mut programs: Option<Programs> = None;
    loop {
        let job = {
            let jobs = jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.recv()
        };
        let Ok(job) = job else { return };
        // Opened lazily and again after a failure: a worker that met EMFILE once recovers
        // with the next job instead of failing every job after.
        if programs.is_none() {
            match Programs::open(&layout) {
                Ok(opened) => programs = Some(opened),
                Err(e) => {
                    let error = format!("opening the pinned programs: {}", chain(&e));
                    let hooks = job
                        .role
                        .points()
                        .iter()
                        .map(|p| (*p, Err(error.clone())))
                        .collect();
                    let _ = reports.send(JobReport { job, hooks });
                    continue;
                }
            }
        }
        let Some(progs) = programs.as_mut() else {
            continue;
        };
        let hooks = attach(progs, &layout, mode, &job);
        let _ = reports.send(JobReport { job, hooks });
    }
}

fn attach(
    progs: &mut Programs,
    layout: &PinLayout,
    mode: TcMode,
    job: &Job,
) -> Vec<(AttachPoint, Result<Attached, String>)> {
    let (ifname, ifindex) = (job.name.as_str(), job.ifindex);
    match job.role {
        Role::Uplink => vec![(
            AttachPoint::Xdp,
            pins::attach_xdp(&mut progs.xdp, layout, ifname, ifindex).map_err(|e| chain(&e)),
        )],
        Role::Workload => [
            (AttachPoint::TcxIngress, &mut progs.ingress),
            (AttachPoint::TcxEgress, &mut progs.egress),
        ]
        .into_iter()
        .map(|(point, prog)| {
            let result = match mode {
                TcMode::Tcx => attach_tcx(prog, layout, ifname, ifindex, point),
                TcMode::Netlink => attach_netlink(prog, layout, ifname, ifindex, point),
            };
            (point, result)
        })
        .collect(),
    }
}

fn direction(point: AttachPoint) -> Direction {
    match point {
        AttachPoint::TcxEgress => Direction::Egress,
        _ => Direction::Ingress,
    }
}

fn attach_type(point: AttachPoint) -> TcAttachType {
    match direction(point) {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    }
}

/// TCX link (pinned, updated in place on restart), then the netlink filter of an earlier
/// netlink-mode agent removed: the new program runs before the old one goes.
fn attach_tcx(
    prog: &mut SchedClassifier,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
    point: AttachPoint,
) -> Result<Attached, String> {
    let how = pins::attach_tc(prog, layout, ifname, ifindex, point).map_err(|e| chain(&e))?;
    match tc_filter::remove_ipq(ifindex, direction(point)) {
        Ok(true) => debug!(
            "{ifname}: removed ipq's netlink {} filter left by netlink mode",
            direction(point).as_str()
        ),
        Ok(false) => {}
        Err(e) => warn!(
            "{ifname}: removing ipq's old netlink {} filter: {e}",
            direction(point).as_str()
        ),
    }
    Ok(how)
}

fn os_error(e: &TcError) -> Option<i32> {
    match e {
        TcError::NetlinkError(e) => e.raw_os_error(),
        TcError::IoError(e) => e.raw_os_error(),
        _ => None,
    }
}

/// clsact qdisc plus ipq's direct-action filter at its own priority and handle: replaced in
/// place when ipq's filter is there (no gap, no second filter), created when the place is free,
/// refused when someone else's filter holds it. Then the TCX link of an earlier TCX-mode agent
/// is unpinned (which detaches it).
fn attach_netlink(
    prog: &mut SchedClassifier,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
    point: AttachPoint,
) -> Result<Attached, String> {
    let dir = direction(point);
    match tc::qdisc_add_clsact(ifname) {
        Ok(()) => {}
        Err(e) if os_error(&e) == Some(libc::EEXIST) => {}
        Err(e) => return Err(format!("adding the clsact qdisc: {}", chain(&e))),
    }
    let place = tc_filter::place(ifindex, dir)
        .map_err(|e| format!("listing {} filters: {e}", dir.as_str()))?;
    let handle = TcHandle::from(TC_FILTER_HANDLE);
    let how = match place {
        Place::Foreign(filter) => {
            return Err(format!(
                "a foreign {} holds ipq's place on the {} hook (pref {TC_FILTER_PRIORITY} \
                 handle {TC_FILTER_HANDLE:#x}); ipq does not touch filters it does not own: \
                 move that filter to another priority",
                filter.describe(),
                dir.as_str()
            ));
        }
        Place::Ipq => {
            let link = SchedClassifierLink::attached(
                ifname,
                attach_type(point),
                TC_FILTER_PRIORITY,
                handle,
                None,
            )
            .map_err(|e| format!("{ifname}: {}", chain(&e)))?;
            let id = prog
                .attach_to_link(link)
                .map_err(|e| format!("replacing ipq's {} filter: {}", dir.as_str(), chain(&e)))?;
            keep_attached(prog.take_link(id))?;
            Attached::Reused
        }
        Place::Free => {
            let id = prog
                .attach_with_options(
                    ifname,
                    attach_type(point),
                    TcAttachOptions::Netlink(NlOptions {
                        priority: TC_FILTER_PRIORITY,
                        handle,
                        classid: None,
                    }),
                )
                .map_err(|e| format!("adding ipq's {} filter: {}", dir.as_str(), chain(&e)))?;
            keep_attached(prog.take_link(id))?;
            Attached::Created
        }
    };
    match pins::remove_pin_of(layout, ifindex, point) {
        Ok(true) => debug!("{ifname}: unpinned the TCX link left by TCX mode"),
        Ok(false) => {}
        Err(e) => warn!("{ifname}: removing the TCX link left by TCX mode: {e}"),
    }
    Ok(how)
}

/// `e` and every error under it: aya's errors keep the OS error (EMFILE...) in their source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

/// A netlink filter outlives the agent by design; aya would delete it when its link object is
/// dropped, so the object (four integers, nothing to free) is forgotten instead.
fn keep_attached(link: Result<SchedClassifierLink, ProgramError>) -> Result<(), String> {
    let link = link.map_err(|e| chain(&e))?;
    std::mem::forget(link);
    Ok(())
}
