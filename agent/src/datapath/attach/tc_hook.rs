//! One TC hook of one workload interface, and how ipq's program gets there: a pinned TCX link,
//! ipq's cls_bpf filter over netlink, or the netlink filter first and the TCX link later
//! (protect first, then the upgrade), as the [`TcMode`] and the job say.

use aya::programs::{
    tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    ProgramError, SchedClassifier, TcAttachType,
};
use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};
use log::{debug, warn};

use super::{
    pins::{self, Attached},
    tc_filter::{self, Direction, Place},
    AttachError, Hooked, JobKind, Mechanism, TcMode,
};
use crate::paths::{AttachPoint, PinLayout};

/// Attaches `prog` at `point` of the interface the way `mode` and `kind` say.
pub(super) fn attach(
    prog: &mut SchedClassifier,
    layout: &PinLayout,
    (ifname, ifindex): (&str, u32),
    point: AttachPoint,
    (mode, kind): (TcMode, JobKind),
) -> Result<Hooked, AttachError> {
    let tc = Tc {
        prog,
        layout,
        ifname,
        ifindex,
        point,
    };
    match (mode, kind) {
        (TcMode::Tcx, _) => tc.tcx_replacing_filter(),
        (TcMode::Netlink, _) => tc.netlink(Unpin::Yes).map(Tc::by_netlink),
        // A repair attaches again the way a first attach does.
        (TcMode::NetlinkThenTcx, JobKind::Protect | JobKind::Repair(_)) => tc.protect_first(),
        (TcMode::NetlinkThenTcx, JobKind::Upgrade) => tc.upgrade(),
    }
}

/// The clsact hook of a TC point (only TC points are attached here).
fn direction(point: AttachPoint) -> Direction {
    Direction::of(point).unwrap_or(Direction::Ingress)
}

fn attach_type(point: AttachPoint) -> TcAttachType {
    match direction(point) {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    }
}

/// Whether a netlink attach removes the TCX link pin of the hook.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unpin {
    /// `tc_attach = "netlink"`: the TCX link an earlier TCX-mode agent left goes.
    Yes,
    /// Protect-first: only a dead pin was there, and it is already gone.
    No,
}

/// One TC hook of one interface, and the program that goes there.
struct Tc<'a> {
    prog: &'a mut SchedClassifier,
    layout: &'a PinLayout,
    ifname: &'a str,
    ifindex: u32,
    point: AttachPoint,
}

impl Tc<'_> {
    fn by_netlink(how: Attached) -> Hooked {
        Hooked {
            how,
            by: Mechanism::Netlink,
        }
    }

    fn dir(&self) -> Direction {
        direction(self.point)
    }

    /// ipq's netlink filter on this hook removed, if it is there. Returns whether it was.
    fn remove_filter(&self) -> std::io::Result<bool> {
        let removed = tc_filter::remove_ipq(self.ifindex, self.dir())?;
        if removed {
            debug!(
                "{}: removed ipq's netlink {} filter: the TCX link holds the hook",
                self.ifname,
                self.dir().as_ref()
            );
        }
        Ok(removed)
    }

    /// `tc_attach = "tcx"`: TCX link (pinned, updated in place on restart), then the netlink
    /// filter of an earlier netlink-mode agent removed: the new program runs before the old
    /// one goes.
    fn tcx_replacing_filter(self) -> Result<Hooked, AttachError> {
        let how = pins::attach_tc(
            self.prog,
            self.layout,
            self.ifname,
            self.ifindex,
            self.point,
        )
        .map_err(|e| AttachError::kernel(None, &e))?;
        if let Err(e) = self.remove_filter() {
            warn!(
                "{}: removing ipq's old netlink {} filter: {e}",
                self.ifname,
                self.dir().as_ref()
            );
        }
        Ok(Hooked {
            how,
            by: Mechanism::Tcx,
        })
    }

    /// Protect-first: a usable pinned TCX link gets the new program (no grace period to wait
    /// for), else the netlink filter goes in at once and the TCX link comes with the upgrade.
    /// Where the filter cannot go (another tool's filter holds ipq's place, no permission for
    /// the clsact qdisc), the TCX link is created right away: never less protection than
    /// TCX alone would give. A filter still there beside a reused link (an agent stopped in
    /// the middle of an upgrade) is removed; if that fails, the hook counts as netlink, so
    /// that the upgrade retries it.
    fn protect_first(mut self) -> Result<Hooked, AttachError> {
        let reused = pins::reuse_tc(
            self.prog,
            self.layout,
            self.ifname,
            self.ifindex,
            self.point,
        )
        .map_err(|e| AttachError::kernel(None, &e))?;
        if !reused {
            let netlink_error = match self.reborrow().netlink(Unpin::No) {
                Ok(how) => return Ok(Tc::by_netlink(how)),
                Err(e) => e,
            };
            debug!(
                "{}: no netlink filter on {} ({netlink_error}); creating the TCX link now",
                self.ifname,
                self.dir().as_ref()
            );
            return self
                .tcx_replacing_filter()
                .map_err(|tcx| AttachError::NeitherWay {
                    netlink: Box::new(netlink_error),
                    tcx: Box::new(tcx),
                });
        }
        match self.remove_filter() {
            Ok(_) => Ok(Hooked {
                how: Attached::Reused,
                by: Mechanism::Tcx,
            }),
            Err(e) => {
                warn!(
                    "{}: removing ipq's {} filter beside its TCX link: {e}; retried",
                    self.ifname,
                    self.dir().as_ref()
                );
                Ok(Hooked {
                    how: Attached::Reused,
                    by: Mechanism::Netlink,
                })
            }
        }
    }

    /// The same hook, for a call that consumes it.
    fn reborrow(&mut self) -> Tc<'_> {
        Tc {
            prog: self.prog,
            layout: self.layout,
            ifname: self.ifname,
            ifindex: self.ifindex,
            point: self.point,
        }
    }

    /// The upgrade: the TCX link first (reused if pinned, else created and pinned), then
    /// ipq's filter removed. Until both are done the hook stays netlink, and is retried.
    fn upgrade(self) -> Result<Hooked, AttachError> {
        let how = pins::attach_tc(
            self.prog,
            self.layout,
            self.ifname,
            self.ifindex,
            self.point,
        )
        .map_err(|e| AttachError::kernel(Some("creating the TCX link".into()), &e))?;
        self.remove_filter().map_err(|e| {
            AttachError::io(
                format!(
                    "the TCX link is in, but removing ipq's {} filter failed",
                    self.dir().as_ref()
                ),
                &e,
            )
        })?;
        Ok(Hooked {
            how,
            by: Mechanism::Tcx,
        })
    }
}

impl Tc<'_> {
    /// clsact qdisc plus ipq's direct-action filter at its own priority and handle: replaced
    /// in place when ipq's filter is there (no gap, no second filter), created when the place
    /// is free, refused when someone else's filter holds it. Then, with [`Unpin::Yes`], the
    /// TCX link of an earlier TCX-mode agent is unpinned (which detaches it).
    fn netlink(self, unpin: Unpin) -> Result<Attached, AttachError> {
        let Tc {
            prog,
            layout,
            ifname,
            ifindex,
            point,
        } = self;
        let dir = direction(point);
        let created = tc_filter::add_clsact(ifindex)
            .map_err(|e| AttachError::io("adding the clsact qdisc", &e))?;
        if !created {
            check_clsact(ifindex)?;
        }
        let place = tc_filter::place(ifindex, dir)
            .map_err(|e| AttachError::io(format!("listing {} filters", dir), &e))?;
        let handle = TcHandle::from(TC_FILTER_HANDLE);
        let how = match place {
            Place::Foreign(filter) => {
                return Err(AttachError::ForeignFilter {
                    filter: filter.describe(),
                    direction: dir.into(),
                });
            }
            Place::Ipq => {
                let link = SchedClassifierLink::attached(
                    ifname,
                    attach_type(point),
                    TC_FILTER_PRIORITY,
                    handle,
                    None,
                )
                .map_err(|e| AttachError::kernel(Some(ifname.to_owned()), &e))?;
                let id = prog.attach_to_link(link).map_err(|e| {
                    AttachError::kernel(Some(format!("replacing ipq's {} filter", dir)), &e)
                })?;
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
                    .map_err(|e| {
                        AttachError::kernel(Some(format!("adding ipq's {} filter", dir)), &e)
                    })?;
                keep_attached(prog.take_link(id))?;
                Attached::Created
            }
        };
        if unpin == Unpin::Yes {
            match pins::remove_pin_of(layout, ifindex, point) {
                Ok(true) => debug!("{ifname}: unpinned the TCX link left by TCX mode"),
                Ok(false) => {}
                Err(e) => warn!("{ifname}: removing the TCX link left by TCX mode: {e}"),
            }
        }
        Ok(how)
    }
}

/// A netlink filter outlives the agent by design; aya would delete it when its link object is
/// dropped, so the object (four integers, nothing to free) is forgotten instead.
fn keep_attached(link: Result<SchedClassifierLink, ProgramError>) -> Result<(), AttachError> {
    let link = link.map_err(|e| AttachError::kernel(None, &e))?;
    std::mem::forget(link);
    Ok(())
}

/// Refuses a hook whose ingress place another qdisc holds: filters put there would all run in
/// that qdisc's one block, and the egress hook would be reported attached while nothing runs.
pub(super) fn check_clsact(ifindex: u32) -> Result<(), AttachError> {
    match tc_filter::ingress_qdisc(ifindex)
        .map_err(|e| AttachError::io("reading the ingress qdisc", &e))?
    {
        tc_filter::IngressQdisc::Foreign(kind) => Err(AttachError::ForeignQdisc { kind }),
        tc_filter::IngressQdisc::Clsact | tc_filter::IngressQdisc::Absent => Ok(()),
    }
}
