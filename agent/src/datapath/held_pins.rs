//! The agent's own references on everything it pinned, so that a pin removed or replaced by
//! someone else lifts nothing and is put back.
//!
//! A pinned TCX or XDP link lives as long as something references it: its pin, or an open
//! descriptor. An agent that closed its descriptors after pinning (as it used to) left the pin
//! as the only reference, so `rm bpffs_dir/links/*` detached every link at once, silently, and
//! a removed map pin made the next agent start on a new, empty map. Here the agent keeps a
//! descriptor of its own on every pin it made or adopted (links, maps, programs) for its whole
//! life: a removed pin detaches nothing while the agent runs, and [`restore`] pins the held
//! object again at its path (replacing whatever foreign object was put there) before anyone
//! could lose it: at every verification ([`super::verify`]), off the owner loop, and on SIGTERM
//! before the agent exits and its descriptors close.
//!
//! One process-wide table, keyed by pin path: the kernel objects belong to the process, and
//! every path under a `bpffs_dir` names one object. Whoever removes one of ipq's pins on
//! purpose (an interface forgotten, a link replaced) calls [`release`] first, or the held
//! descriptor would keep the link attached.

use crate::datapath::bpf_call::{bpf_with, zeroed_attr};
use crate::paths::AttachPoint;
use aya_obj::generated::{bpf_attach_type, bpf_cmd, bpf_link_info};
use std::{
    collections::BTreeMap,
    ffi::CString,
    fmt, fs, io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
};

/// An object ipq pinned, held by a descriptor of the agent's own.
struct Held {
    fd: OwnedFd,
    /// The kernel's id of the object: what tells ours from a foreign one at the same path.
    id: u32,
    /// For a link, the id of the program it ran when the agent took hold of it (after
    /// attaching or swapping its own program in): what tells a link someone updated to
    /// another program (`BPF_LINK_UPDATE` through its pin) from ours.
    program: u32,
}

static HELD: Mutex<BTreeMap<PathBuf, Held>> = Mutex::new(BTreeMap::new());

fn held() -> MutexGuard<'static, BTreeMap<PathBuf, Held>> {
    // A panic elsewhere while holding the lock leaves the table itself consistent.
    HELD.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// A new descriptor on the object pinned at `path`.
fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let path = c_path(path)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    let fd = bpf_with(bpf_cmd::BPF_OBJ_GET, &mut attr)?;
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the object of `fd` at `path` (which must not exist).
fn obj_pin(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    let path = c_path(path)?;
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_4.pathname = path.as_ptr() as u64;
    attr.__bindgen_anon_4.bpf_fd = fd.as_raw_fd() as u32;
    bpf_with(bpf_cmd::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// The object's info, read as a `bpf_link_info`: `bpf_map_info` and `bpf_prog_info` start with
/// the same type and id, and the kernel fills only what its own struct of that object has
/// (the rest stays zero).
fn obj_info(fd: &OwnedFd) -> io::Result<bpf_link_info> {
    // SAFETY: a C struct of integers and unions of them: all zeros is valid.
    let mut info: bpf_link_info = unsafe { std::mem::zeroed() };
    let mut attr = zeroed_attr();
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = std::mem::size_of::<bpf_link_info>() as u32;
    attr.info.info = std::ptr::from_mut(&mut info) as u64;
    bpf_with(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(info)
}

/// The kernel's id of the object behind `fd`: every info struct starts with its type and then
/// its id.
fn obj_id(fd: &OwnedFd) -> io::Result<u32> {
    obj_info(fd).map(|info| info.id)
}

/// Where a held link stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Attached to its device, running the program the agent put in it.
    Attached,
    /// No longer attached (detached through its pin, or the device went).
    Detached,
    /// Attached, but running another program: someone updated it through its pin.
    Replaced,
}

/// Where the link held for `path` stands; `None` when the agent holds nothing there.
/// `bpf_link_info`'s union holds the device's ifindex for TCX and XDP links (the same place in
/// both), 0 once detached.
pub fn link_state(path: &Path) -> Option<LinkState> {
    let held = held();
    let object = held.get(path)?;
    let info = obj_info(&object.fd).ok()?;
    // SAFETY: a union of plain integers; the kernel zeroes what a link type does not fill.
    let ifindex = unsafe { info.__bindgen_anon_1.tcx.ifindex };
    Some(if ifindex == 0 {
        LinkState::Detached
    } else if info.prog_id != object.program {
        LinkState::Replaced
    } else {
        LinkState::Attached
    })
}

/// Where ipq's TCX link stands on its hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcxPlace {
    /// First: ipq's program sees every packet of the hook.
    First,
    /// Another program runs before it and could end processing (`TCX_PASS`) unseen.
    Behind,
    /// Not on the hook (detached through its pin, or the device is gone).
    Absent,
    /// On the hook, but running another program than the one the agent put in it.
    Replaced,
}

/// One hook's TCX chain as `BPF_PROG_QUERY` lists it, in the order the programs run.
struct TcxChain {
    prog_ids: Vec<u32>,
    link_ids: Vec<u32>,
    /// More programs on the hook than listed.
    truncated: bool,
}

/// The most programs of one hook a query lists.
const TCX_QUERY_MAX: usize = 64;

/// One `BPF_PROG_QUERY` of `point` on `ifindex` (the kernel takes `rtnl_lock` for it).
fn tcx_chain(ifindex: u32, point: AttachPoint) -> Option<io::Result<TcxChain>> {
    let attach_type = match point {
        AttachPoint::TcxIngress => bpf_attach_type::BPF_TCX_INGRESS,
        AttachPoint::TcxEgress => bpf_attach_type::BPF_TCX_EGRESS,
        AttachPoint::Xdp => return None,
    };
    let mut prog_ids = [0u32; TCX_QUERY_MAX];
    let mut link_ids = [0u32; TCX_QUERY_MAX];
    let mut attr = zeroed_attr();
    attr.query.__bindgen_anon_1.target_ifindex = ifindex;
    attr.query.attach_type = attach_type as u32;
    attr.query.prog_ids = prog_ids.as_mut_ptr() as u64;
    attr.query.__bindgen_anon_2.count = prog_ids.len() as u32;
    attr.query.link_ids = link_ids.as_mut_ptr() as u64;
    let truncated = match bpf_with(bpf_cmd::BPF_PROG_QUERY, &mut attr) {
        Ok(_) => false,
        // More programs on the hook than listed: ipq's, if there, is not first.
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => true,
        Err(e) => return Some(Err(e)),
    };
    // SAFETY: a union of two u32 (`prog_cnt`, `count`); the kernel wrote how many are on it.
    let count = unsafe { attr.query.__bindgen_anon_2.count } as usize;
    let listed = count.min(TCX_QUERY_MAX);
    Some(Ok(TcxChain {
        prog_ids: prog_ids[..listed].to_vec(),
        link_ids: link_ids[..listed].to_vec(),
        truncated: truncated || count > TCX_QUERY_MAX,
    }))
}

/// Where the TCX link held for `path` (the link of `point` on `ifindex`) stands: one
/// `BPF_PROG_QUERY` of the hook (the kernel takes `rtnl_lock` for it), whose link ids come in
/// the order the programs run. `None` when the agent holds nothing at `path`.
pub fn tcx_place(path: &Path, ifindex: u32, point: AttachPoint) -> Option<TcxPlace> {
    let (id, program) = held().get(path).map(|h| (h.id, h.program))?;
    let chain = match tcx_chain(ifindex, point)? {
        Ok(chain) => chain,
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Some(TcxPlace::Absent),
        Err(_) => return None,
    };
    Some(match chain.link_ids.iter().position(|link| *link == id) {
        // The query lists each link's program beside it, in the same order.
        Some(at) if chain.prog_ids[at] != program => TcxPlace::Replaced,
        Some(0) => TcxPlace::First,
        Some(_) => TcxPlace::Behind,
        None if chain.truncated => TcxPlace::Behind,
        None => TcxPlace::Absent,
    })
}

/// The ids of the programs that run before the TCX link held for `path` on its hook, in the
/// order they run; `None` when the agent holds nothing there, the hook cannot be queried, or
/// ipq's link is not among the programs listed (more than a query lists).
pub fn tcx_programs_ahead(path: &Path, ifindex: u32, point: AttachPoint) -> Option<Vec<u32>> {
    let id = held().get(path).map(|h| h.id)?;
    let chain = tcx_chain(ifindex, point)?.ok()?;
    let at = chain.link_ids.iter().position(|link| *link == id)?;
    Some(chain.prog_ids[..at].to_vec())
}

/// Detaches the link held for `path` from its hook now (`BPF_LINK_DETACH`): the kernel takes
/// the program off under `rtnl_lock` before answering. Letting go of the descriptors and the
/// pin frees the link only once the last reference is dropped, which may come after a new
/// link of the same program asks for the hook (`bpf_mprog` then answers EEXIST).
pub fn detach(path: &Path) -> io::Result<()> {
    let held = held();
    let Some(object) = held.get(path) else {
        return Ok(());
    };
    let mut attr = zeroed_attr();
    attr.link_detach.link_fd = object.fd.as_raw_fd() as u32;
    bpf_with(bpf_cmd::BPF_LINK_DETACH, &mut attr).map(drop)
}

/// Takes a descriptor of the agent's own on the object pinned at `path` (replacing any held
/// for that path before). Fails when nothing is pinned there: for a link just pinned, that
/// means someone removed the pin in between, and the link is gone with it.
pub fn hold(path: &Path) -> io::Result<()> {
    let fd = obj_get(path)?;
    let info = obj_info(&fd)?;
    let (id, program) = (info.id, info.prog_id);
    held().insert(path.to_owned(), Held { fd, id, program });
    Ok(())
}

/// Holds every object pinned directly under `dir` (the maps, the programs).
pub fn hold_dir(dir: &Path) -> io::Result<usize> {
    let mut count = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            continue;
        }
        hold(&entry.path())?;
        count += 1;
    }
    Ok(count)
}

/// The id of the program the link held for `path` ran when the agent took hold of it.
pub fn held_program(path: &Path) -> Option<u32> {
    held().get(path).map(|h| h.program)
}

/// Lets go of the object at `path`: call before removing one of ipq's pins on purpose.
pub fn release(path: &Path) {
    held().remove(path);
}

/// The paths of the pins under `root` that the agent holds.
pub fn held_under(root: &Path) -> Vec<PathBuf> {
    held()
        .range(root.to_owned()..)
        .take_while(|(path, _)| path.starts_with(root))
        .map(|(path, _)| path.clone())
        .collect()
}

/// What was wrong with one of ipq's pins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinLoss {
    /// Nothing at the path.
    Removed,
    /// Another object (or none that bpf can open) at the path.
    Replaced,
}

impl fmt::Display for PinLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Removed => "removed",
            Self::Replaced => "replaced",
        })
    }
}

/// Pins `fd` at `path` again, making its directory again first if that went too (`rm -r
/// bpffs_dir/links`), the way the agent makes it.
fn repin(fd: &OwnedFd, path: &Path) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|dir| !dir.exists()) {
        ipq_fs::safe_fs::ensure_dir(dir, ipq_fs::safe_fs::DirAccess::Traversable)
            .map_err(|e| io::Error::other(e.to_string()))?;
    }
    obj_pin(fd, path)
}

/// One pin found lost by [`restore`], and whether it is back.
#[derive(Debug)]
pub struct Restored {
    pub path: PathBuf,
    pub loss: PinLoss,
    /// `Err` when it could not be pinned again (retried at the next [`restore`]).
    pub outcome: io::Result<()>,
}

/// Checks the pins under `root` (one `bpffs_dir`) that the agent holds, and pins the held
/// object again where its pin was removed or replaced. O(pins), a few syscalls each: run it
/// off the owner loop.
pub fn restore(root: &Path) -> Vec<Restored> {
    let held = held();
    let mut restored = Vec::new();
    for (path, object) in held.range(root.to_owned()..) {
        if !path.starts_with(root) {
            break;
        }
        let loss = match obj_get(path) {
            Ok(fd) if obj_id(&fd).is_ok_and(|id| id == object.id) => continue,
            Ok(_) => PinLoss::Replaced,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => PinLoss::Removed,
            Err(_) => PinLoss::Replaced,
        };
        let outcome = match loss {
            PinLoss::Removed => repin(&object.fd, path),
            // Unlinking a foreign pin drops only its reference; ours goes in its place.
            PinLoss::Replaced => fs::remove_file(path).and_then(|()| obj_pin(&object.fd, path)),
        };
        restored.push(Restored {
            path: path.clone(),
            loss,
            outcome,
        });
    }
    restored
}

/// Says what [`restore`] found: a WARN line per pin (someone else removed or replaced it).
/// Returns how many were lost.
pub fn report(restored: &[Restored]) -> usize {
    for pin in restored {
        match &pin.outcome {
            Ok(()) => log::warn!(
                "pin {} was {} by someone else; pinned ipq's object there again (the agent's \
                 own descriptor kept it alive meanwhile)",
                pin.path.display(),
                pin.loss
            ),
            Err(e) => log::warn!(
                "pin {} was {} by someone else and cannot be pinned again yet ({e}); the \
                 agent's descriptor keeps the object alive; retried at the next verification",
                pin.path.display(),
                pin.loss
            ),
        }
    }
    restored.len()
}
