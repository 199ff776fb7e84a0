//! The watcher's user side: its raw tracepoint attached at load, its ring read as it becomes readable,
//! and each reported `bpf()` call of another process turned into a poke of the verification
//! ([`Pokes`]), which then looks at once at what the call may have changed.
//!
//! What is reported (`ipq_common::watch`): every link detach, update and create and every
//! program attach and detach (anything may have been ipq's: its links are verified); every
//! open of one of ipq's pinned maps by its path or by its id (its maps are compared: a one-shot
//! tool writes right after it opens), after which the process's map writes are reported too
//! (this side puts it in `IPQ_WATCHED`).
//!
//! Where the program cannot be attached (another architecture than x86-64, a kernel or a policy
//! that refuses tracing programs), the periodic verification is all there is, and `ipq status`
//! says so.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, AtomicU8, Ordering},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::RawTracePoint,
    Ebpf,
};
use ipq_common::{
    names,
    watch::{
        BpfCall, BpfCmd, MAP_BPF_CALLS, MAP_BPF_CALLS_LOST, MAP_WATCHED, PROG_WATCH_BPF,
        WATCHED_TRACEPOINT, WATCH_KEY_BYTES,
    },
};
use strum::VariantArray as _;
use tokio::sync::Notify;

use super::{program, DatapathError};
use crate::paths::{AttachPoint, PinLayout};

/// What the verification should look at, as the watcher pokes it; and whether the watcher
/// still reads its ring, so that `ipq status` says what finds another tool's changes as it is
/// now, not as it was at start.
#[derive(Default)]
pub struct Pokes {
    pending: AtomicU8,
    notify: Notify,
    stopped: std::sync::OnceLock<String>,
    /// Calls the kernel could not report (its ring was full), as last read.
    lost: AtomicU64,
}

/// A poke's scope: bits of [`Pokes::pending`].
pub const POKE_LINKS: u8 = 1;
pub const POKE_MAPS: u8 = 2;
/// A link detached: a look at the held links' state alone (one question each, no `rtnl_lock`)
/// finds it, if it was one of ipq's; nothing else can have changed.
pub const POKE_DETACH: u8 = 4;

impl Pokes {
    pub fn poke(&self, scope: u8) {
        self.pending.fetch_or(scope, Ordering::AcqRel);
        self.notify.notify_one();
    }

    /// Waits for a poke (one made since the last [`Self::take`] returns at once).
    pub async fn poked(&self) {
        if self.pending.load(Ordering::Acquire) == 0 {
            self.notify.notified().await;
        }
    }

    /// The scope poked since the last call.
    pub fn take(&self) -> u8 {
        self.pending.swap(0, Ordering::AcqRel)
    }

    /// The reader stopped for `why`: nothing pokes any more, the periodic pass alone finds
    /// another tool's changes.
    pub fn stop(&self, why: String) {
        // The first reason is the one that stopped it; there is no second reader.
        let _ = self.stopped.set(why);
    }

    /// Records that the kernel has lost `total` calls in all (a full ring) and, when that is
    /// more than before, pokes everything: a lost call may have been anything. Returns how many
    /// are new.
    pub fn lost(&self, total: u64) -> u64 {
        let before = self.lost.fetch_max(total, Ordering::AcqRel);
        let new = total.saturating_sub(before);
        if new > 0 {
            self.poke(POKE_LINKS | POKE_MAPS);
        }
        new
    }

    /// Calls lost to a full ring since the watcher was attached.
    pub fn lost_total(&self) -> u64 {
        self.lost.load(Ordering::Acquire)
    }

    /// Why the reader stopped, if it did.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.get().map(String::as_str)
    }
}

/// The attached watcher: its ring, and what makes sense of the ring's records.
pub struct BpfWatch {
    pub calls: RingBuf<MapData>,
    pub lost: LostCalls,
    pub classifier: Classifier,
}

/// The kernel's per-CPU count of calls it could not report because the ring was full.
pub struct LostCalls(PerCpuArray<MapData, u64>);

impl LostCalls {
    /// The count summed over the CPUs.
    pub fn total(&self) -> Result<u64, aya::maps::MapError> {
        Ok(self.0.get(&0, 0)?.iter().sum())
    }
}

/// What a record means for ipq: the processes whose map writes are reported, ipq's maps.
pub struct Classifier {
    watched: HashMap<MapData, u32, u32>,
    /// ipq's pinned maps' ids, and the directory of their pins.
    map_ids: Vec<u32>,
    maps_dir: PathBuf,
    /// Where ipq's links are pinned, by interface and hook.
    layout: PinLayout,
}

/// Loads and attaches the watcher of the loaded object `ebpf`, its maps pinned under `layout`.
pub fn attach(ebpf: &mut Ebpf, layout: &PinLayout) -> Result<BpfWatch, DatapathError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(DatapathError::WatcherArch);
    }
    let prog: &mut RawTracePoint = program(ebpf, PROG_WATCH_BPF)?;
    let program_error = |source| DatapathError::Program {
        name: PROG_WATCH_BPF,
        source,
    };
    prog.load().map_err(program_error)?;
    prog.attach(WATCHED_TRACEPOINT).map_err(program_error)?;
    let take = |ebpf: &mut Ebpf, name: &'static str| {
        ebpf.take_map(name)
            .ok_or(DatapathError::MissingMap { name })
    };
    let calls =
        RingBuf::try_from(take(ebpf, MAP_BPF_CALLS)?).map_err(|source| DatapathError::Map {
            name: MAP_BPF_CALLS,
            source,
        })?;
    let lost = PerCpuArray::try_from(take(ebpf, MAP_BPF_CALLS_LOST)?).map_err(|source| {
        DatapathError::Map {
            name: MAP_BPF_CALLS_LOST,
            source,
        }
    })?;
    let watched =
        HashMap::try_from(take(ebpf, MAP_WATCHED)?).map_err(|source| DatapathError::Map {
            name: MAP_WATCHED,
            source,
        })?;
    let mut map_ids = Vec::new();
    for name in names::PINNED_MAPS {
        let path = layout.map(name);
        let map = MapData::from_pin(&path).map_err(|source| DatapathError::OpenPin {
            path: path.clone(),
            source,
        })?;
        map_ids.push(
            map.info()
                .map_err(|source| DatapathError::Map { name, source })?
                .id(),
        );
    }
    Ok(BpfWatch {
        calls,
        lost: LostCalls(lost),
        classifier: Classifier {
            watched,
            map_ids,
            maps_dir: layout.maps_dir(),
            layout: layout.clone(),
        },
    })
}

/// One reported call, as the verification sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A link or program attachment changed somewhere: ipq's links are looked at.
    Attachment { cmd: BpfCmd, tgid: u32, target: u32 },
    /// One of ipq's maps opened (the process is watched from now on) or written by a watched
    /// process: the maps are compared, and the entry a single-entry write names is looked at
    /// at once (`key`: its 16 bytes, or its 4 zero-padded).
    Maps {
        cmd: BpfCmd,
        tgid: u32,
        key: Option<ReportedKey>,
    },
    /// Something of no concern to ipq (another tool's pin or map opened).
    Elsewhere,
}

impl Classifier {
    /// What a record of the ring means for ipq; a process that opened one of its maps is
    /// watched from now on.
    pub fn classify(&mut self, record: &[u8]) -> Option<Seen> {
        let call = decode(record)?;
        let cmd = BpfCmd::from_repr(call.cmd)?;
        let seen = match cmd {
            // Another tool's attachment to an interface ipq holds no link on (a pod's veth of
            // another CNI, a cgroup) cannot displace ipq's: no pass for it. (The ifindex is the
            // caller's namespace's: one of another namespace may cost a needless pass.)
            BpfCmd::LinkCreate | BpfCmd::ProgAttach | BpfCmd::ProgDetach
                if call.target != 0 && !self.holds_links_on(call.target) =>
            {
                Seen::Elsewhere
            }
            BpfCmd::LinkDetach
            | BpfCmd::LinkUpdate
            | BpfCmd::LinkCreate
            | BpfCmd::ProgAttach
            | BpfCmd::ProgDetach => Seen::Attachment {
                cmd,
                tgid: call.tgid,
                target: call.target,
            },
            BpfCmd::ObjGet if self.is_ipq_pin(&call.path) => self.watch(cmd, call.tgid),
            BpfCmd::MapGetFdById if self.map_ids.contains(&call.target) => {
                self.watch(cmd, call.tgid)
            }
            BpfCmd::ObjGet | BpfCmd::MapGetFdById => Seen::Elsewhere,
            BpfCmd::MapUpdateElem | BpfCmd::MapDeleteElem => Seen::Maps {
                cmd,
                tgid: call.tgid,
                key: reported_key(&call),
            },
            BpfCmd::MapUpdateBatch | BpfCmd::MapDeleteBatch => Seen::Maps {
                cmd,
                tgid: call.tgid,
                key: None,
            },
        };
        Some(seen)
    }

    fn watch(&mut self, cmd: BpfCmd, tgid: u32) -> Seen {
        if let Err(e) = self.watched.insert(tgid, 1, 0) {
            log::warn!(
                "process {tgid} opened one of ipq's maps; its writes will not be announced: {e}"
            );
        }
        Seen::Maps {
            cmd,
            tgid,
            key: None,
        }
    }

    /// Whether ipq holds a link on `ifindex` (its pin is there): three lookups.
    fn holds_links_on(&self, ifindex: u32) -> bool {
        AttachPoint::VARIANTS
            .iter()
            .any(|point| self.layout.link(ifindex, *point).exists())
    }

    /// Whether `path` (NUL-terminated) names a pin under ipq's maps directory.
    fn is_ipq_pin(&self, path: &[u8]) -> bool {
        let end = path.iter().position(|b| *b == 0).unwrap_or(path.len());
        let Ok(path) = std::str::from_utf8(&path[..end]) else {
            return false;
        };
        Path::new(path).starts_with(&self.maps_dir)
    }
}

/// The key of a map write, as the watcher read it: 16 bytes of an `IPQ_ADDRS` address, whose
/// first 4 are also read as an index of `IPQ_SLOTS` or `IPQ_IFACES` (the watcher cannot tell
/// which of ipq's maps a descriptor is: each meaning is looked at, one lookup each).
pub type ReportedKey = [u8; WATCH_KEY_BYTES];

/// Keys of one wakeup's map writes, as the ring reader hands them on: at most this many (the
/// comparison of the whole maps, poked as well, finds whatever a longer burst wrote).
pub const REPORTED_KEYS_AT_ONCE: usize = 64;

/// Map writes' keys reported together, and when: they are looked at once the calls are done
/// ([`super::verify::WATCH_SETTLE`] later).
#[derive(Debug)]
pub struct ReportedKeys {
    pub seen_at: tokio::time::Instant,
    pub keys: Vec<ReportedKey>,
}

fn reported_key(call: &BpfCall) -> Option<ReportedKey> {
    let len = (call.target as usize).min(WATCH_KEY_BYTES);
    if len == 0 {
        return None;
    }
    let mut key = [0u8; WATCH_KEY_BYTES];
    key[..len].copy_from_slice(&call.path[..len]);
    Some(key)
}

fn decode(bytes: &[u8]) -> Option<BpfCall> {
    if bytes.len() != std::mem::size_of::<BpfCall>() {
        return None;
    }
    // SAFETY: the length is checked; BpfCall is Pod (valid for any bytes).
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<BpfCall>()) })
}
