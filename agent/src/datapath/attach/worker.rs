//! One attach worker: a thread with its own handles on the loaded programs, opened from their
//! pins under `bpffs_dir/progs`, which turns jobs into attachments and reports each outcome.
//!
//! aya's program objects are not `Sync`: each worker owns its own handles, so workers never
//! share one and need no lock around an attach.

use std::sync::Arc;

use aya::programs::{ProgramError, SchedClassifier, Xdp};
use aya_obj::programs::XdpAttachType;
use ipq_common::names;

use super::{
    pins, queue::JobQueue, repair, tc_hook, AttachError, Hooked, Job, JobKind, JobReport,
    Mechanism, TcMode,
};
use crate::paths::{AttachPoint, PinLayout};

/// The programs one worker attaches, opened from their pins.
pub(super) struct Programs {
    ingress: SchedClassifier,
    egress: SchedClassifier,
    /// The second instances of the TC programs, for moves without a gap ([`pins::Instances`]);
    /// `None` where the agent did not load them (no TCX, or their load failed).
    ingress_spare: Option<SchedClassifier>,
    egress_spare: Option<SchedClassifier>,
    xdp: Xdp,
}

impl Programs {
    fn open(layout: &PinLayout) -> Result<Self, ProgramError> {
        Ok(Self {
            ingress: SchedClassifier::from_pin(layout.program(names::PROG_TC_INGRESS))?,
            egress: SchedClassifier::from_pin(layout.program(names::PROG_TC_EGRESS))?,
            // Absent where the agent did not load them: a move then has a gap (said where it
            // happens).
            ingress_spare: SchedClassifier::from_pin(layout.program(names::PROG_TC_INGRESS_SPARE))
                .ok(),
            egress_spare: SchedClassifier::from_pin(layout.program(names::PROG_TC_EGRESS_SPARE))
                .ok(),
            xdp: Xdp::from_pin(
                layout.program(names::PROG_XDP_UPLINK),
                XdpAttachType::Interface,
            )?,
        })
    }
}

/// Where a worker reports: the bounded queue to the owner loop, and the count of the times a
/// report found it full and the worker waited.
pub struct Reports {
    pub tx: tokio::sync::mpsc::Sender<JobReport>,
    pub overflows: prometheus::IntCounter,
}

/// Runs jobs from `jobs` until it is closed, reporting each on `reports` (waiting for room
/// while the queue is full: a report may be the only news of a lost attachment).
pub fn run(layout: PinLayout, mode: TcMode, jobs: Arc<JobQueue>, reports: Reports) {
    let mut programs: Option<Programs> = None;
    while let Some(job) = jobs.take() {
        let _done = Done {
            jobs: &jobs,
            job: job.clone(),
        };
        let mut report = run_one(&mut programs, &layout, mode, job);
        report.ahead = super::bypass::find(&report);
        // The loop gone means the agent is stopping: the job is handed back all the same.
        let _ = crate::queues::send_or_wait(&reports.tx, report, &reports.overflows);
    }
}

/// Hands a job back as done when dropped, after its report was sent, and also if the worker
/// panicked: its interface and lane must not stay busy forever.
struct Done<'a> {
    jobs: &'a JobQueue,
    job: Job,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.jobs.done(&self.job);
    }
}

fn run_one(
    programs: &mut Option<Programs>,
    layout: &PinLayout,
    mode: TcMode,
    job: Job,
) -> JobReport {
    // Opened lazily and again after a failure: a worker that met EMFILE once recovers
    // with the next job instead of failing every job after.
    let progs = match programs {
        Some(progs) => progs,
        None => match Programs::open(layout) {
            Ok(opened) => programs.insert(opened),
            Err(e) => {
                let error = AttachError::kernel(Some("opening the pinned programs".into()), &e);
                let hooks = job
                    .role
                    .points()
                    .iter()
                    .map(|p| (*p, Err(error.clone())))
                    .collect();
                return JobReport {
                    job,
                    hooks,
                    found_missing: Vec::new(),
                    ahead: Vec::new(),
                };
            }
        },
    };
    if let JobKind::Repair(_) = job.kind {
        let target = job.clone();
        return repair::run(job, layout, |point, fix| match (fix, point) {
            (repair::Fix::MoveFirst, AttachPoint::TcxIngress | AttachPoint::TcxEgress) => {
                let instances = if point == AttachPoint::TcxIngress {
                    pins::Instances {
                        main: &mut progs.ingress,
                        spare: progs.ingress_spare.as_mut(),
                    }
                } else {
                    pins::Instances {
                        main: &mut progs.egress,
                        spare: progs.egress_spare.as_mut(),
                    }
                };
                pins::move_tc_first(instances, layout, &target.name, target.ifindex, point)
                    .map(|how| Hooked {
                        how,
                        by: Mechanism::Tcx,
                    })
                    .map_err(|e| AttachError::kernel(None, &e))
            }
            _ => attach_point(progs, layout, mode, &target, point, JobKind::Protect),
        });
    }
    let hooks = job
        .role
        .points()
        .iter()
        .map(|&point| {
            (
                point,
                attach_point(progs, layout, mode, &job, point, job.kind),
            )
        })
        .collect();
    JobReport {
        job,
        hooks,
        found_missing: Vec::new(),
        ahead: Vec::new(),
    }
}

/// Attaches ipq's program at one `point` of the job's interface, for a job of `kind`.
pub(super) fn attach_point(
    progs: &mut Programs,
    layout: &PinLayout,
    mode: TcMode,
    job: &Job,
    point: AttachPoint,
    kind: JobKind,
) -> Result<Hooked, AttachError> {
    let (ifname, ifindex) = (job.name.as_str(), job.ifindex);
    let prog = match point {
        AttachPoint::Xdp => {
            return pins::attach_xdp(&mut progs.xdp, layout, ifname, ifindex)
                .map(|how| Hooked {
                    how,
                    by: Mechanism::Xdp,
                })
                .map_err(|e| AttachError::kernel(None, &e));
        }
        AttachPoint::TcxIngress => &mut progs.ingress,
        AttachPoint::TcxEgress => &mut progs.egress,
    };
    tc_hook::attach(prog, layout, (ifname, ifindex), point, (mode, kind))
}
