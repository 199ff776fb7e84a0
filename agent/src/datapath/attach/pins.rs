//! TCX and XDP links, pinned so they stay attached across agent restarts.
//!
//! Every link is pinned under `bpffs_dir/links`. A new agent re-opens the pin and swaps its own
//! program into the existing link (`bpf_link_update`, atomic): there is no moment without a
//! program, and never a second attachment. Only when the pin is missing or its link is dead (the
//! device went away) is a new link created.
//!
//! The agent also keeps a descriptor of its own on every link it pinned or adopted
//! ([`held_pins`]): a pin removed by someone else then detaches nothing, and is put back.

use std::{collections::BTreeSet, fs, io, path::Path};

use aya::programs::{
    links::{FdLink, LinkError, LinkOrder, PinnedLink},
    tc::{SchedClassifierLink, TcAttachOptions},
    xdp::XdpLink,
    SchedClassifier, TcAttachType, Xdp, XdpMode,
};
use log::{debug, info, warn};

use super::super::{held_pins, DatapathError};
use crate::paths::{AttachPoint, PinLayout};

/// How an attachment came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// The pinned link of a previous agent now runs this agent's program.
    Reused,
    /// A new link was created and pinned.
    Created,
}

fn tc_attach_type(point: AttachPoint) -> TcAttachType {
    match point {
        AttachPoint::TcxEgress => TcAttachType::Egress,
        _ => TcAttachType::Ingress,
    }
}

/// Opens the pinned link of (`ifindex`, `point`), if one exists.
fn open_pin(path: &Path) -> Result<Option<FdLink>, DatapathError> {
    if !path.exists() {
        return Ok(None);
    }
    match PinnedLink::from_pin(path) {
        Ok(pinned) => Ok(Some(pinned.into())),
        Err(LinkError::SyscallError(e)) => {
            warn!(
                "pinned link {} cannot be opened ({}); replacing it",
                path.display(),
                e.io_error
            );
            remove_pin(path)?;
            Ok(None)
        }
        Err(source) => Err(DatapathError::Link {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Removes one of ipq's link pins on purpose: the agent's own descriptor goes first, so the
/// link detaches.
fn remove_pin(path: &Path) -> Result<(), DatapathError> {
    held_pins::release(path);
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DatapathError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Pins a link just created (a bpf_link; anything else is refused) at `path`.
fn pin_new<L>(link: L, path: &Path) -> Result<Attached, DatapathError>
where
    FdLink: TryFrom<L, Error = LinkError>,
{
    let fd_link = FdLink::try_from(link).map_err(|source| DatapathError::Link {
        path: path.to_owned(),
        source,
    })?;
    fd_link.pin(path).map_err(|source| DatapathError::Pin {
        path: path.to_owned(),
        source,
    })?;
    hold(path)?;
    Ok(Attached::Created)
}

/// Keeps the agent's own descriptor on the link pinned at `path`. Failing means the pin went
/// (and the link with it) since it was made or opened: the attach fails and is retried.
fn hold(path: &Path) -> Result<(), DatapathError> {
    held_pins::hold(path).map_err(|source| DatapathError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Attaches `prog` to the TCX hook `point` of `ifname`, first in the chain: through the pinned
/// link if there is a usable one ([`reuse_tc`]), else a new link, pinned.
pub fn attach_tc(
    prog: &mut SchedClassifier,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
    point: AttachPoint,
) -> Result<Attached, DatapathError> {
    if reuse_tc(prog, layout, ifname, ifindex, point)? {
        return Ok(Attached::Reused);
    }
    new_tcx_link_first(prog, ifname, point, &layout.link(ifindex, point))
}

/// A new TCX link of `prog`, first on the hook, pinned at `path`.
fn new_tcx_link_first(
    prog: &mut SchedClassifier,
    ifname: &str,
    point: AttachPoint,
    path: &Path,
) -> Result<Attached, DatapathError> {
    let attach_err = |source| DatapathError::Attach {
        ifname: ifname.to_owned(),
        point,
        source,
    };
    let id = prog
        .attach_with_options(
            ifname,
            tc_attach_type(point),
            TcAttachOptions::TcxOrder(LinkOrder::first()),
        )
        .map_err(attach_err)?;
    pin_new(prog.take_link(id).map_err(attach_err)?, path)
}

/// The two instances of one TC program (the same code on the same maps): a hook takes a
/// program once, so a link of the other instance can go in ahead while the old one still runs.
pub struct Instances<'a> {
    pub main: &'a mut SchedClassifier,
    /// `None` where the agent has no spare instance (then a move has a gap).
    pub spare: Option<&'a mut SchedClassifier>,
}

/// Puts ipq's program first again on a TCX hook where something was attached before ipq's
/// link, make-before-break: a new link of the instance the old link does not run goes in at
/// the head, then the old link is detached explicitly (`BPF_LINK_DETACH`) and the new one
/// pinned in its place. Every packet meets one of ipq's two links throughout: a co-tenant that
/// hands some packets on leaks none while ipq moves. Where the new link cannot go in (an
/// instance missing, the kernel refusing), the old way: the old link detached first, then a new
/// one of its own program created at the front (for one RCU grace period, ~16 ms, ipq's program
/// is off the hook).
pub fn move_tc_first(
    programs: Instances<'_>,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
    point: AttachPoint,
) -> Result<Attached, DatapathError> {
    let path = layout.link(ifindex, point);
    let running = held_pins::held_program(&path);
    let id_of = |prog: &SchedClassifier| prog.info().ok().map(|info| info.id());
    let Instances { main, spare } = programs;
    let main_runs = running.is_some() && id_of(main) == running;
    // The instance the old link does not run, if there is one; else the main one after a gap.
    let (next, fallback): (Option<&mut SchedClassifier>, &mut SchedClassifier) =
        match (spare, main_runs) {
            (Some(spare), true) => (Some(spare), main),
            (Some(spare), false) => (Some(main), spare),
            (None, _) => (None, main),
        };
    let made = match next {
        Some(next) => next
            .attach_with_options(
                ifname,
                tc_attach_type(point),
                TcAttachOptions::TcxOrder(LinkOrder::first()),
            )
            .and_then(|id| next.take_link(id))
            .map_err(|e| e.to_string()),
        None => Err("the agent has no spare instance of the program".to_owned()),
    };
    let link = match made {
        Ok(link) => FdLink::try_from(link).map_err(|source| DatapathError::Link {
            path: path.clone(),
            source,
        })?,
        Err(e) => {
            warn!(
                "{ifname}: a second link of ipq's {point} program cannot go in ahead ({e}); \
                 moving the old one first instead (ipq's program is off the hook for a grace \
                 period)"
            );
            if let Err(e) = held_pins::detach(&path) {
                debug!("{ifname}: detaching ipq's {} link: {e}", point);
            }
            remove_pin(&path)?;
            let attached = new_tcx_link_first(fallback, ifname, point, &path)?;
            info!("{ifname}: ipq's {} link is first again", point);
            return Ok(attached);
        }
    };
    // The new link runs first: only now does the old one go.
    if let Err(e) = held_pins::detach(&path) {
        // Already detached (the device went, or another tool detached it).
        debug!("{ifname}: detaching ipq's old {} link: {e}", point);
    }
    remove_pin(&path)?;
    link.pin(&path).map_err(|source| DatapathError::Pin {
        path: path.clone(),
        source,
    })?;
    hold(&path)?;
    info!(
        "{ifname}: ipq's {} link is first again (moved without a gap)",
        point
    );
    Ok(Attached::Created)
}

/// Swaps `prog` into the pinned TCX link of (`ifindex`, `point`), if there is one that still
/// works (`bpf_link_update`: atomic, and no RCU grace period to wait for). Returns whether it
/// did; a pin whose link is dead or not a TCX link is removed.
pub fn reuse_tc(
    prog: &mut SchedClassifier,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
    point: AttachPoint,
) -> Result<bool, DatapathError> {
    let path = layout.link(ifindex, point);
    let Some(fd_link) = open_pin(&path)? else {
        return Ok(false);
    };
    match SchedClassifierLink::try_from(fd_link) {
        Ok(link) => match prog.attach_to_link(link) {
            Ok(id) => {
                // Dropping our handle closes only the fd: the pin keeps the link.
                let taken = prog.take_link(id).map_err(|source| DatapathError::Attach {
                    ifname: ifname.to_owned(),
                    point,
                    source,
                })?;
                drop(taken);
                hold(&path)?;
                debug!("{ifname}: reused pinned {} link", point);
                return Ok(true);
            }
            Err(e) => info!(
                "{ifname}: pinned {} link is no longer usable ({e}); replacing it",
                point.as_ref()
            ),
        },
        Err(e) => warn!(
            "{ifname}: pin {} is not a TCX link ({e}); replacing it",
            path.display()
        ),
    }
    remove_pin(&path)?;
    Ok(false)
}

/// Attaches `prog` as the XDP program of the uplink `ifname`.
pub fn attach_xdp(
    prog: &mut Xdp,
    layout: &PinLayout,
    ifname: &str,
    ifindex: u32,
) -> Result<Attached, DatapathError> {
    let point = AttachPoint::Xdp;
    let path = layout.link(ifindex, point);
    let attach_err = |source| DatapathError::Attach {
        ifname: ifname.to_owned(),
        point,
        source,
    };
    if let Some(fd_link) = open_pin(&path)? {
        match XdpLink::try_from(fd_link) {
            Ok(link) => match prog.attach_to_link(link) {
                Ok(id) => {
                    drop(prog.take_link(id).map_err(attach_err)?);
                    hold(&path)?;
                    debug!("{ifname}: reused pinned xdp link");
                    return Ok(Attached::Reused);
                }
                Err(e) => info!("{ifname}: pinned xdp link is no longer usable ({e})"),
            },
            Err(e) => warn!(
                "{ifname}: pin {} is not an XDP link ({e}); replacing it",
                path.display()
            ),
        }
        remove_pin(&path)?;
    }
    let id = prog
        .attach_to_if_index(ifindex, XdpMode::Default)
        .map_err(attach_err)?;
    // Only a bpf_link can be pinned; the netlink fallback of old kernels cannot survive a
    // restart without a gap, so it is refused rather than silently used.
    pin_new(prog.take_link(id).map_err(attach_err)?, &path)
}

/// Removes the pin of (`ifindex`, `point`), which detaches its link. Returns whether one was
/// there.
pub fn remove_pin_of(
    layout: &PinLayout,
    ifindex: u32,
    point: AttachPoint,
) -> Result<bool, DatapathError> {
    let path = layout.link(ifindex, point);
    if !path.exists() {
        // Let go of it all the same: a job still running when the interface was forgotten
        // may have taken it again after the pin went, and a held link whose pin is missing
        // would be pinned back by the next verification.
        held_pins::release(&path);
        return Ok(false);
    }
    remove_pin(&path)?;
    Ok(true)
}

/// Removes (and so detaches) every link pin not in `keep`. Returns what it removed.
pub fn prune(
    layout: &PinLayout,
    keep: &BTreeSet<(u32, AttachPoint)>,
) -> Result<Vec<(u32, AttachPoint)>, DatapathError> {
    let dir = layout.links_dir();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(DatapathError::Io { path: dir, source }),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| DatapathError::Io {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        let Some(parsed) = name.to_str().and_then(PinLayout::parse_link_name) else {
            continue;
        };
        if !keep.contains(&parsed) {
            remove_pin(&entry.path())?;
            removed.push(parsed);
        }
    }
    Ok(removed)
}
