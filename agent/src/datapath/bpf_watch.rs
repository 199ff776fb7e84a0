//! The watcher's user side: its programs attached at load, its ring read as it becomes
//! readable, and each reported `bpf()` call of another process turned into a poke of the
//! verification ([`Pokes`]), which then looks at once at what the call may have changed.
//!
//! Which programs ([`WatchMode`]): the trampolines on the kernel's bpf() path where every one
//! of them attaches (the kernel's BTF, Linux 5.5+ on x86-64, 6.0+ on arm64, and the functions
//! with the arguments they read; map updates at `bpf_map_update_value`, or where the BTF has
//! none, at the hash and array maps' update functions: [`UpdateHook`]); else the raw tracepoint on
//! `sys_enter` (x86-64 only); else none, and the periodic verification is all there is.
//! `ipq status` and `ipq_datapath_bpf_watcher_mode` say which, and why not the better one.
//!
//! What is reported (`ipq_common::watch`): every link detach, update and create and every
//! program attach and detach (anything may have been ipq's: its links are verified); every
//! open of one of ipq's maps (its maps are compared: a one-shot tool writes right after it
//! opens). Map writes: with the trampolines, every write of ipq's maps by any process, with
//! the kernel's copy of the key, however the caller got its descriptor, and every memory
//! mapping of them; with the raw tracepoint, the writes of the processes that opened one of
//! ipq's pins by its absolute path (this side puts them in `IPQ_WATCHED`).

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{FEntry, RawTracePoint},
    Btf, Ebpf,
};
use ipq_common::{
    names,
    watch::{
        BpfCall, BpfCmd, UpdateHook, WatchMode, MAP_BPF_CALLS, MAP_BPF_CALLS_LOST, MAP_WATCHED,
        MAP_WATCHED_MAPS, PROG_WATCH_BPF, TRAMPOLINES, UPDATE_HOOKS, WATCHED_MAPS,
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
pub struct Pokes {
    pending: AtomicU8,
    notify: Notify,
    stopped: std::sync::OnceLock<String>,
    /// Calls the kernel could not report (its ring was full), as last read.
    lost: AtomicU64,
    /// The programs that report the calls.
    mode: WatchMode,
    /// Why not the trampolines, where the mode is another.
    why_not_trampolines: Option<String>,
    /// Another process mapped one of ipq's maps, whose writes through the mapping no call
    /// announces: from then on every periodic pass compares the maps in full.
    mapped_by_another: AtomicBool,
}

/// A poke's scope: bits of [`Pokes::pending`].
pub const POKE_LINKS: u8 = 1;
pub const POKE_MAPS: u8 = 2;
/// The pins and netlink filters alone (a periodic pass while the trampolines see every bpf()
/// change of links and maps): no question per link under `rtnl_lock`, no comparison.
pub const POKE_PINS: u8 = 8;
/// A link detached: a look at the held links' state alone (one question each, no `rtnl_lock`)
/// finds it, if it was one of ipq's; nothing else can have changed.
pub const POKE_DETACH: u8 = 4;

impl Pokes {
    pub fn new(mode: WatchMode, why_not_trampolines: Option<String>) -> Self {
        Self {
            pending: AtomicU8::new(0),
            notify: Notify::new(),
            stopped: std::sync::OnceLock::new(),
            lost: AtomicU64::new(0),
            mode,
            why_not_trampolines,
            mapped_by_another: AtomicBool::new(false),
        }
    }

    /// The programs that report the calls.
    pub fn mode(&self) -> WatchMode {
        self.mode
    }

    /// Why the trampolines are not the watcher, where they are not.
    pub fn why_not_trampolines(&self) -> Option<&str> {
        self.why_not_trampolines.as_deref()
    }

    /// Another process mapped one of ipq's maps (or one was mapped before the agent looked):
    /// its writes through the mapping are seen by no call, only by comparing the maps.
    pub fn mapped_by_another(&self) {
        if !self.mapped_by_another.swap(true, Ordering::AcqRel) {
            log::warn!(
                "another process holds a memory mapping of ipq's maps: its writes through it \
                 are announced by no call; the maps are compared in full at every periodic pass"
            );
        }
        self.poke(POKE_MAPS);
    }

    /// Whether every change of ipq's maps and attachments reaches the agent as a reported call
    /// (the trampolines read their ring, and no other process has mapped ipq's maps): then the
    /// periodic pass need not compare everything every time. Lost calls poke a full pass.
    pub fn sees_every_change(&self) -> bool {
        self.mode == WatchMode::Trampolines
            && self.stopped.get().is_none()
            && !self.mapped_by_another.load(Ordering::Acquire)
    }

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
    /// The programs that report the calls.
    pub mode: WatchMode,
    /// Why not the trampolines, where the mode is another.
    pub why_not_trampolines: Option<String>,
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
    /// The raw tracepoint's watched processes (unused by the trampolines).
    watched: HashMap<MapData, u32, u32>,
    mode: WatchMode,
    /// ipq's pinned maps' ids, and the directory of their pins.
    map_ids: Vec<u32>,
    /// `IPQ_PROBES`' id: a write of it may fake what a co-tenant probe found.
    probes_map_id: u32,
    maps_dir: PathBuf,
    /// Where ipq's links are pinned, by interface and hook.
    layout: PinLayout,
    /// Writable mappings of ipq's maps the agent itself made, as the trampolines reported them.
    own_mappings: u32,
}

/// Loads and attaches the watcher of the loaded object `ebpf`, its maps pinned under `layout`:
/// the trampolines if they all attach (`trampolines` says why not, if the kernel's BTF could
/// not be read at load), else the raw tracepoint if `raw_tracepoint_allowed` (the operator's
/// `bpf_watcher = trampolines` keeps its cost off every other system call of the node).
pub fn attach(
    ebpf: &mut Ebpf,
    layout: &PinLayout,
    trampolines: Result<UpdateHook, String>,
    raw_tracepoint_allowed: bool,
) -> Result<BpfWatch, DatapathError> {
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
    let take = |ebpf: &mut Ebpf, name: &'static str| {
        ebpf.take_map(name)
            .ok_or(DatapathError::MissingMap { name })
    };
    let map_error = |name| move |source| DatapathError::Map { name, source };
    let mut watched_maps: Array<MapData, u32> =
        Array::try_from(take(ebpf, MAP_WATCHED_MAPS)?).map_err(map_error(MAP_WATCHED_MAPS))?;
    if map_ids.len() > WATCHED_MAPS as usize {
        return Err(DatapathError::WatchedMaps {
            maps: map_ids.len(),
            room: WATCHED_MAPS,
        });
    }
    // Before anything is attached: the trampolines report these maps' writes from the start.
    for (index, id) in (0u32..).zip(&map_ids) {
        watched_maps
            .set(index, id, 0)
            .map_err(map_error(MAP_WATCHED_MAPS))?;
    }
    let (mode, why_not_trampolines) =
        match trampolines.and_then(|hook| attach_trampolines(ebpf, hook)) {
            Ok(()) => (WatchMode::Trampolines, None),
            Err(why) if !raw_tracepoint_allowed => {
                return Err(DatapathError::Watcher {
                    trampolines: why,
                    raw_tracepoint: "not tried: bpf_watcher = trampolines (every system call of \
                                     the node would pay for it)"
                        .to_owned(),
                })
            }
            Err(why) => {
                attach_raw_tracepoint(ebpf).map_err(|e| DatapathError::Watcher {
                    trampolines: why.clone(),
                    raw_tracepoint: e.to_string(),
                })?;
                (WatchMode::RawTracepoint, Some(why))
            }
        };
    let calls = RingBuf::try_from(take(ebpf, MAP_BPF_CALLS)?).map_err(map_error(MAP_BPF_CALLS))?;
    let lost = PerCpuArray::try_from(take(ebpf, MAP_BPF_CALLS_LOST)?)
        .map_err(map_error(MAP_BPF_CALLS_LOST))?;
    let watched = HashMap::try_from(take(ebpf, MAP_WATCHED)?).map_err(map_error(MAP_WATCHED))?;
    Ok(BpfWatch {
        calls,
        lost: LostCalls(lost),
        classifier: Classifier {
            watched,
            mode,
            probes_map_id: names::PINNED_MAPS
                .iter()
                .position(|name| *name == names::MAP_PROBES)
                .map(|at| map_ids[at])
                .expect("IPQ_PROBES is one of PINNED_MAPS (asserted in ipq-common)"),
            map_ids,
            maps_dir: layout.maps_dir(),
            layout: layout.clone(),
            own_mappings: 0,
        },
        mode,
        why_not_trampolines,
    })
}

/// How `ipq status` and the log name a watcher mode.
pub fn describe(mode: WatchMode) -> String {
    match mode {
        WatchMode::Trampolines => {
            "fentry trampolines on the kernel's bpf() path: other system calls pay nothing"
                .to_owned()
        }
        WatchMode::RawTracepoint => format!(
            "raw tracepoint {WATCHED_TRACEPOINT}: every system call of the node pays for it \
             (bpf_watcher = \"trampolines\" keeps it off)"
        ),
        WatchMode::None => "none".to_owned(),
    }
}

/// Loads and attaches every trampoline, map updates seen by `update_hook`'s; where one that
/// the watcher needs does not, those attached already are unloaded (detached) and the reason
/// returned.
fn attach_trampolines(ebpf: &mut Ebpf, update_hook: UpdateHook) -> Result<(), String> {
    let btf = Btf::from_sys_fs().map_err(|e| format!("the kernel's BTF: {e}"))?;
    let updates = UPDATE_HOOKS
        .iter()
        .find(|(hook, _)| *hook == update_hook)
        .map_or(&[][..], |(_, programs)| *programs)
        .iter()
        .map(|(name, function)| (*name, *function, false));
    let mut attached = Vec::new();
    let mut failure = None;
    for (name, function, optional) in TRAMPOLINES.into_iter().chain(updates) {
        let attach = |ebpf: &mut Ebpf| -> Result<(), String> {
            let prog: &mut FEntry = program(ebpf, name).map_err(|e| e.to_string())?;
            prog.load(function, &btf)
                .map_err(|e| format!("loading {name} for {function}: {}", program_error(&e)))?;
            prog.attach()
                .map_err(|e| format!("attaching {name} to {function}: {}", program_error(&e)))?;
            Ok(())
        };
        match attach(ebpf) {
            Ok(()) => attached.push(name),
            Err(why) if optional => {
                log::info!("bpf() watcher: {why}; that path does not exist on this kernel")
            }
            Err(why) => {
                failure = Some(why);
                break;
            }
        }
    }
    let Some(why) = failure else {
        if update_hook == UpdateHook::MapOps {
            log::info!(
                "bpf() watcher: this kernel's BTF has no bpf_map_update_value (inlined): map \
                 updates are seen at the hash and array maps' update functions, which other \
                 tools' BPF programs' map updates also pass (one compare each)"
            );
        }
        return Ok(());
    };
    for name in attached {
        if let Ok(prog) = program::<FEntry>(ebpf, name) {
            let _ = prog.unload();
        }
    }
    Err(why)
}

/// An aya program error with its verifier log's last lines, if any.
fn program_error(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(3).collect();
            format!(
                "{io_error} ({})",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
            )
        }
        other => other.to_string(),
    }
}

/// The fallback: the raw tracepoint on `sys_enter` (x86-64 only: it reads that architecture's
/// system call registers).
fn attach_raw_tracepoint(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
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
    Ok(())
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
    /// `IPQ_PROBES` written by another process (the trampolines name the map): what the
    /// co-tenant probes found may have been faked, so every co-tenant is judged again.
    Probes { cmd: BpfCmd, tgid: u32 },
    /// A memory mapping of one of ipq's maps made: `foreign` if another process made it, or
    /// the kernel counted writable mappings before the agent's own that the agent did not
    /// make (a process that mapped it before the agent started).
    Mapped { tgid: u32, foreign: bool },
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
            BpfCmd::MapOpen if self.map_ids.contains(&call.map_id) => self.watch(cmd, call.tgid),
            BpfCmd::ObjGet | BpfCmd::MapGetFdById | BpfCmd::MapOpen => Seen::Elsewhere,
            BpfCmd::MapMmap => {
                let own = call.path[0] == 1;
                // The count before this mapping: the agent's own earlier ones are all it may
                // hold if nobody else maps the map.
                let foreign = !own || call.target > self.own_mappings;
                if own {
                    self.own_mappings += 1;
                }
                Seen::Mapped {
                    tgid: call.tgid,
                    foreign,
                }
            }
            BpfCmd::MapUpdateElem
            | BpfCmd::MapDeleteElem
            | BpfCmd::MapUpdateBatch
            | BpfCmd::MapDeleteBatch
                if call.map_id != 0 && call.map_id == self.probes_map_id =>
            {
                Seen::Probes {
                    cmd,
                    tgid: call.tgid,
                }
            }
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

    /// Whether a map write's record names the map written (the trampolines do; the raw
    /// tracepoint sees a descriptor only, so any of its writes may be of `IPQ_PROBES`).
    pub fn names_written_maps(&self) -> bool {
        self.mode == WatchMode::Trampolines
    }

    fn watch(&mut self, cmd: BpfCmd, tgid: u32) -> Seen {
        // The trampolines report every write of ipq's maps whoever makes it.
        if self.mode == WatchMode::RawTracepoint {
            self.watch_writes_of(tgid);
        }
        Seen::Maps {
            cmd,
            tgid,
            key: None,
        }
    }

    fn watch_writes_of(&mut self, tgid: u32) {
        if let Err(e) = self.watched.insert(tgid, 1, 0) {
            log::warn!(
                "process {tgid} opened one of ipq's maps; its writes will not be announced: {e}"
            );
        }
    }

    /// Whether ipq holds a link on `ifindex` (its pin is there): three lookups.
    fn holds_links_on(&self, ifindex: u32) -> bool {
        AttachPoint::VARIANTS
            .iter()
            .any(|point| self.layout.link(ifindex, *point).exists())
    }

    /// Whether `path` (NUL-terminated) names a pin under ipq's maps directory (the raw
    /// tracepoint's reports; a relative path is not resolved).
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
