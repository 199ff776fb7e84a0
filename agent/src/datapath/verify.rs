//! The backstop: what the kernel has, compared every `verify_interval` with what ipq believes,
//! off the owner loop, for what no notification announces.
//!
//! The TC notifications ([`super::attach::tc_watch`]) catch a deleted qdisc or filter within
//! milliseconds; nothing announces a pin removed or a TCX or XDP link detached through its pin
//! (`bpftool link detach pinned ...`). Each pass:
//!
//! 1. checks every pin the agent holds (links, maps, programs) and pins back what was removed
//!    or replaced ([`held_pins::restore`]);
//! 2. asks the kernel whether each held TCX and XDP link is still attached to its device, and
//!    whether each TCX link still runs first on its hook (a program put before it that ends
//!    processing would hide every packet from ipq); either is handed to the owner loop, which
//!    queues a repair of its interface.
//!
//! 3. dumps the filters of every hook ipq's netlink filter should hold (the TC notifications
//!    announce every change there; this catches what a lost notification would hide);
//! 4. compares `IPQ_ADDRS`, `IPQ_SLOTS`, `IPQ_IFACES` and `IPQ_QBLOOM` with the mirror of what
//!    their one writer wrote ([`map_check`]; no notification announces a map write), for the
//!    owner loop to look again at what differs, and only that.
//!
//! O(pins + hooks + addresses): a few syscalls per pin, one dump per netlink hook, a batched
//! read of the maps; the pass's duration is a gauge (`ipq_datapath_verify_seconds`) and is
//! shown in `ipq status`. Between passes the mirror takes in the table's writes every
//! [`ABSORB_EVERY`], so that what the owner loop queues for it stays small.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{mpsc, watch};

use super::{
    attach::{
        cotenant::{self, Ahead, Verdict},
        tc_filter::{self, Direction},
    },
    bpf_watch::{Pokes, POKE_LINKS, POKE_MAPS, POKE_PINS},
    held_pins::{self, LinkState, Restored, TcxPlace},
    intent::IntentMirror,
    map_check::{self, MapSuspects},
    MapDrift,
};
use crate::paths::{AttachPoint, PinLayout};

/// One hook of one interface: (ifindex, attach point).
pub type Hook = (u32, AttachPoint);

/// The hooks ipq's netlink filter holds, by ifindex: written by the attacher on the owner
/// loop, read by the verification off it.
pub type NetlinkHooks = Arc<Mutex<BTreeMap<u32, Vec<AttachPoint>>>>;

/// One pass's findings.
#[derive(Debug)]
pub struct Verification {
    /// When the pass began: what it found of a hook ipq has looked at since is stale.
    pub started: Instant,
    /// Only the held links' state was looked at (a pass for a reported link detach): the
    /// pins, the links' place on their hooks, the filters and the maps were not, and nothing
    /// is said of them.
    pub links_state_only: bool,
    pub finished_at: SystemTime,
    pub took: Duration,
    /// Pins the agent holds, all checked.
    pub pins: usize,
    /// Pins someone else removed or replaced (pinned back, or why not).
    pub restored: Vec<Restored>,
    /// Held links no longer attached to their device: (ifindex, hook).
    pub detached: Vec<(u32, AttachPoint)>,
    /// Held TCX links that something was attached before: (ifindex, hook), and what the
    /// programs ahead do with the interface's addresses' packets ([`cotenant::judge`]).
    pub behind: Vec<(Hook, Verdict)>,
    /// Held links someone updated to run another program: (ifindex, hook).
    pub replaced: Vec<(u32, AttachPoint)>,
    /// Hooks that should hold ipq's netlink filter and do not: (ifindex, hook).
    pub filters_missing: Vec<(u32, AttachPoint)>,
    /// Hooks holding ipq's netlink filter where another filter runs first: (ifindex, hook),
    /// and what the filters ahead do with the interface's addresses' packets.
    pub filters_ahead: Vec<(Hook, Verdict)>,
    /// Whether the pins will outlive the agent (`bpffs_dir` still on its bpf filesystem), or
    /// why not.
    pub bpffs: Result<(), String>,
    /// What in the maps differs from what their writer wrote, for the owner loop to look at
    /// again (or why they could not be compared); `None` for a pass the watcher asked for the
    /// links only.
    pub maps: Option<Result<MapSuspects, String>>,
}

/// The lines of `ipq status` for map entries found written by another process: the first
/// [`DRIFT_SHOWN`], then how many more.
pub fn drift_lines(drift: &[MapDrift]) -> Vec<String> {
    let mut lines: Vec<String> = drift
        .iter()
        .take(DRIFT_SHOWN)
        .map(|d| {
            format!(
                "{} {}: held {}, ipq wrote {}: {}",
                d.map,
                d.key,
                d.found,
                d.wanted,
                d.error.as_ref().map_or_else(
                    || "written back".to_owned(),
                    |e| format!("NOT written back ({e})")
                )
            )
        })
        .collect();
    if drift.len() > DRIFT_SHOWN {
        lines.push(format!(
            "... and {} more map entries written back",
            drift.len() - DRIFT_SHOWN
        ));
    }
    lines
}

/// What the last pass found, as `ipq status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    pub finished_at: SystemTime,
    pub took: Duration,
    pub pins: usize,
    /// One line per thing found wrong; empty when everything was in place.
    pub found: Vec<String>,
}

impl Verification {
    /// Why the pins under `bpffs_dir` cannot be kept, if they cannot: the filesystem is gone
    /// from under them, or a pin cannot be put back. Enforcement would end with this agent,
    /// so `/readyz` fails while this says so.
    pub fn pins_problem(&self) -> Option<String> {
        let failed: Vec<String> = self
            .restored
            .iter()
            .filter_map(|r| {
                r.outcome
                    .as_ref()
                    .err()
                    .map(|e| format!("{}: {e}", r.path.display()))
            })
            .collect();
        match (&self.bpffs, failed.is_empty()) {
            (Ok(()), true) => None,
            (Ok(()), false) => Some(format!(
                "pins cannot be restored ({}{}): enforcement would end with this agent",
                failed[..failed.len().min(3)].join("; "),
                if failed.len() > 3 { "; ..." } else { "" }
            )),
            (Err(why), _) => Some(format!(
                "{why}; {} pins cannot be restored: enforcement would end with this agent",
                failed.len()
            )),
        }
    }
}

/// Map differences named one by one in `ipq status`; the rest are counted.
const DRIFT_SHOWN: usize = 8;

impl Verification {
    /// What the pass found, with what the owner loop's comparison of the maps found (`drift`).
    pub fn summary(&self, drift: &[MapDrift]) -> Summary {
        let mut found: Vec<String> = self
            .restored
            .iter()
            .map(|r| {
                format!(
                    "pin {} {}: {}",
                    r.path.display(),
                    r.loss,
                    match &r.outcome {
                        Ok(()) => "pinned again".to_owned(),
                        Err(e) => format!("not pinned again yet ({e})"),
                    }
                )
            })
            .collect();
        found.extend(
            self.detached
                .iter()
                .map(|(ifindex, point)| format!("if{ifindex} {} link detached: repairing", point)),
        );
        found.extend(self.replaced.iter().map(|(ifindex, point)| {
            format!(
                "if{ifindex} {} link runs another program: putting ipq's back",
                point.as_ref()
            )
        }));
        found.extend(self.filters_missing.iter().map(|(ifindex, point)| {
            format!(
                "if{ifindex} {}: ipq's filter missing: repairing",
                point.name_under_filter()
            )
        }));
        // A co-tenant that hands packets on is nothing wrong: `ipq status` shows it with
        // its interface.
        found.extend(
            self.behind
                .iter()
                .filter(|(_, verdict)| !verdict.hands_on())
                .map(|((ifindex, _), verdict)| {
                    format!("if{ifindex} {}: moving ipq's first", verdict.why())
                }),
        );
        found.extend(
            self.filters_ahead
                .iter()
                .filter(|(_, verdict)| !verdict.hands_on())
                .map(|((ifindex, _), verdict)| format!("if{ifindex} {}", verdict.why())),
        );
        if let Some(problem) = self.pins_problem() {
            found.push(problem);
        }
        if let Some(Err(e)) = &self.maps {
            found.push(format!("maps not verified: {e}"));
        }
        found.extend(drift_lines(drift));
        Summary {
            finished_at: self.finished_at,
            took: self.took,
            pins: self.pins,
            found,
        }
    }
}

/// The hooks of `hooks` whose netlink filter is not ipq's any more, as the kernel lists them
/// (one filter dump per hook; an interface gone meanwhile is skipped, its removal forgets it).
pub fn missing_filters(hooks: &BTreeMap<u32, Vec<AttachPoint>>) -> Vec<(u32, AttachPoint)> {
    look_at_filters(false, hooks).0
}

/// One filter dump per hook of `hooks`: the hooks whose netlink filter is not ipq's any more,
/// and the hooks where another filter runs before ipq's (a notification lost would hide
/// either), each with what the filters ahead do with the interface's addresses' packets
/// (looked for and judged only when `judge`).
pub fn look_at_filters(
    judge: bool,
    hooks: &BTreeMap<u32, Vec<AttachPoint>>,
) -> (Vec<Hook>, Vec<(Hook, Verdict)>) {
    let (mut missing, mut ahead) = (Vec::new(), Vec::new());
    for (&ifindex, points) in hooks {
        for &point in points {
            let Some(direction) = Direction::of(point) else {
                continue;
            };
            let Ok(filters) = tc_filter::list(ifindex, direction) else {
                continue;
            };
            if !filters.iter().any(tc_filter::Filter::is_ipq) {
                missing.push((ifindex, point));
                continue;
            }
            if !judge {
                continue;
            }
            let found: Vec<Ahead> = tc_filter::all_ahead_of_ipq(&filters)
                .into_iter()
                .map(Ahead::Filter)
                .collect();
            if !found.is_empty() {
                let verdict = cotenant::judge(ifindex, point, &found);
                ahead.push(((ifindex, point), verdict));
            }
        }
    }
    (missing, ahead)
}

/// One pass over the pins under `root` (one `bpffs_dir`) and the hooks of `netlink_hooks`; the
/// held links' place on their hooks when `look_at_links`, and the maps compared with `mirror`
/// when `compare_maps`.
pub fn verify(
    root: &Path,
    netlink_hooks: &NetlinkHooks,
    look_at_links: bool,
    compare_maps: bool,
    mirror: Option<&mut IntentMirror>,
) -> Verification {
    let started = Instant::now();
    let restored = held_pins::restore(root);
    held_pins::report(&restored);
    let held = held_pins::held_under(root);
    let layout = PinLayout::new(root);
    let (mut detached, mut behind, mut replaced) = (Vec::new(), Vec::new(), Vec::new());
    let links = held_links(root, &held).filter(|_| look_at_links);
    for (path, link) in links {
        let (ifindex, point) = link;
        // One question to the kernel per link: each takes rtnl_lock, which every pod
        // creation on the node needs too.
        let place = match point {
            AttachPoint::Xdp => match held_pins::link_state(path) {
                Some(LinkState::Detached) => Some(TcxPlace::Absent),
                Some(LinkState::Replaced) => Some(TcxPlace::Replaced),
                Some(LinkState::Attached) | None => None,
            },
            _ => held_pins::tcx_place(path, ifindex, point),
        };
        match place {
            Some(TcxPlace::Absent) => detached.push(link),
            Some(TcxPlace::Behind) => {
                let verdict = match held_pins::tcx_programs_ahead(path, ifindex, point) {
                    Some(ids) => {
                        let ahead: Vec<Ahead> = ids.into_iter().map(Ahead::Program).collect();
                        cotenant::judge(ifindex, point, &ahead)
                    }
                    None => Verdict::CannotTell(format!(
                        "{}: ipq's link is behind more programs than one query lists",
                        point.as_ref()
                    )),
                };
                behind.push((link, verdict));
            }
            Some(TcxPlace::Replaced) => replaced.push(link),
            Some(TcxPlace::First) | None => {}
        }
    }
    // A copy, so the attacher is never kept waiting for the dumps.
    let hooks = netlink_hooks
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    let (filters_missing, filters_ahead) = look_at_filters(true, &hooks);
    let maps = compare_maps.then(|| match mirror {
        Some(mirror) => map_check::compare(&layout, mirror).map_err(|e| e.to_string()),
        None => Err("no mirror of the address table to compare with".to_owned()),
    });
    let bpffs = super::bpffs::outlives_agent(root);
    Verification {
        started,
        links_state_only: false,
        finished_at: SystemTime::now(),
        took: started.elapsed(),
        pins: held.len(),
        restored,
        detached,
        behind,
        replaced,
        filters_missing,
        filters_ahead,
        bpffs,
        maps,
    }
}

/// The held pins of `held` that are links, with the hook each names.
fn held_links<'a>(root: &Path, held: &'a [PathBuf]) -> impl Iterator<Item = (&'a Path, Hook)> {
    let links_dir = PinLayout::new(root).links_dir();
    held.iter().filter_map(move |path| {
        if path.parent() != Some(links_dir.as_path()) {
            return None;
        }
        let name = path.file_name()?.to_str()?;
        Some((path.as_path(), PinLayout::parse_link_name(name)?))
    })
}

/// The state of each held link alone (attached, detached, running another program): one
/// question per link about its own descriptor, none of the `rtnl_lock` the place on a hook
/// needs, so a link detached through its pin is found in milliseconds at 1000 interfaces.
pub fn links_state(root: &Path) -> Verification {
    let started = Instant::now();
    let held = held_pins::held_under(root);
    let (mut detached, mut replaced) = (Vec::new(), Vec::new());
    for (path, link) in held_links(root, &held) {
        match held_pins::link_state(path) {
            Some(LinkState::Detached) => detached.push(link),
            Some(LinkState::Replaced) => replaced.push(link),
            Some(LinkState::Attached) | None => {}
        }
    }
    Verification {
        started,
        links_state_only: true,
        finished_at: SystemTime::now(),
        took: started.elapsed(),
        pins: held.len(),
        restored: Vec::new(),
        detached,
        behind: Vec::new(),
        replaced,
        filters_missing: Vec::new(),
        filters_ahead: Vec::new(),
        bpffs: Ok(()),
        maps: None,
    }
}

/// How often the mirror takes in the table's writes between passes.
pub const ABSORB_EVERY: Duration = Duration::from_millis(250);

/// How long a pass the watcher asks for waits after the call it reported: the watcher sees a
/// call as it starts, and the pass must find what it did. Pokes meanwhile join the same pass.
pub const WATCH_SETTLE: Duration = Duration::from_millis(2);

/// The least time between the starts of two passes the watcher asks for: a tool that opens
/// ipq's pins or detaches links in a loop gets a pass every this often, not one after another
/// (a comparison of 64k addresses takes milliseconds of a CPU). The first poke after a quiet
/// spell waits only [`WATCH_SETTLE`].
pub const POKED_GAP: Duration = Duration::from_millis(50);

/// The longest time between two periodic passes that look at everything (every link's place
/// on its hook, the maps compared in full) while the trampolines see every change: the
/// backstop for what they cannot see (a kernel bug, a change by a path not hooked). Between
/// them a periodic pass checks the pins and the netlink filters only. Without trampolines,
/// or with a mapping of ipq's maps held by another process, every periodic pass is full.
pub const FULL_SWEEP_EVERY: Duration = Duration::from_secs(60);

/// What asks for a pass besides the clock, and where passes are counted.
pub struct Triggers {
    /// The watcher of other processes' bpf() calls, if one is attached.
    pub pokes: Option<Arc<Pokes>>,
    /// `ipq_datapath_verify_passes_total{cause, maps}`.
    pub passes: prometheus::IntCounterVec,
}

/// Verifies every `every`, and at once (after [`WATCH_SETTLE`]) when `pokes` (the watcher of
/// other processes' bpf() calls) says so, until `stop` says so. Each pass's findings are sent
/// to the owner loop (a periodic pass is skipped while the loop has not taken the last one; a
/// poked one waits for it). A pass under way when `stop` comes runs to its end first: the
/// shutdown's own look at the pins must not race it.
pub async fn run(
    root: PathBuf,
    netlink_hooks: NetlinkHooks,
    every: Duration,
    mirror: Option<IntentMirror>,
    triggers: Triggers,
    findings: mpsc::Sender<Verification>,
    mut stop: watch::Receiver<bool>,
) {
    let Triggers { pokes, passes } = triggers;
    let mirror = Arc::new(Mutex::new(mirror));
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut absorbs = tokio::time::interval(ABSORB_EVERY);
    absorbs.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_poked: Option<tokio::time::Instant> = None;
    let mut last_full: Option<tokio::time::Instant> = None;
    loop {
        let (scope, poked) = tokio::select! {
            _ = ticks.tick() => {
                let now = tokio::time::Instant::now();
                let sees_every_change = pokes.as_deref().is_some_and(Pokes::sees_every_change);
                let sweep_due = last_full.is_none_or(|last| now >= last + FULL_SWEEP_EVERY);
                if sees_every_change && !sweep_due {
                    (POKE_PINS, false)
                } else {
                    last_full = Some(now);
                    (POKE_LINKS | POKE_MAPS, false)
                }
            }
            _ = absorbs.tick() => {
                absorb(&mirror).await;
                continue;
            }
            scope = poked(pokes.as_deref(), last_poked) => (scope, true),
            _ = stop.changed() => return,
        };
        let compare_maps = scope & POKE_MAPS != 0;
        let look_at_links = scope & POKE_LINKS != 0;
        let links_state_only = scope & (POKE_LINKS | POKE_MAPS | POKE_PINS) == 0;
        passes
            .with_label_values(&[
                if poked { "watcher" } else { "periodic" },
                if compare_maps {
                    "compared"
                } else {
                    "not_compared"
                },
            ])
            .inc();
        if poked {
            last_poked = Some(tokio::time::Instant::now());
        }
        let (root, hooks, mirror) = (root.clone(), netlink_hooks.clone(), mirror.clone());
        let pass = move || {
            if links_state_only {
                return links_state(&root);
            }
            let mut mirror = mirror
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            verify(&root, &hooks, look_at_links, compare_maps, mirror.as_mut())
        };
        match tokio::task::spawn_blocking(pass).await {
            Ok(verification) if poked => {
                if findings.send(verification).await.is_err() {
                    return;
                }
            }
            Ok(verification) => {
                if findings.try_send(verification).is_err() && findings.is_closed() {
                    return;
                }
            }
            Err(e) => log::error!("verifying the datapath: {e}"),
        }
    }
}

/// The scope of the next poke, once [`WATCH_SETTLE`] has passed since it and [`POKED_GAP`]
/// since the last poked pass began; never without a watcher.
async fn poked(pokes: Option<&Pokes>, last: Option<tokio::time::Instant>) -> u8 {
    let Some(pokes) = pokes else {
        return std::future::pending().await;
    };
    pokes.poked().await;
    tokio::time::sleep(WATCH_SETTLE).await;
    if let Some(last) = last {
        tokio::time::sleep_until(last + POKED_GAP).await;
    }
    pokes.take()
}

/// Takes the table's writes into the mirror, off the async workers (a merge of the mirror is
/// O(addresses)); nothing to do costs a lock.
async fn absorb(mirror: &Arc<Mutex<Option<IntentMirror>>>) {
    let behind = mirror
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .as_ref()
        .is_some_and(IntentMirror::behind);
    if !behind {
        return;
    }
    let mirror = mirror.clone();
    let merge = move || {
        if let Some(mirror) = mirror
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_mut()
        {
            mirror.absorb();
        }
    };
    if let Err(e) = tokio::task::spawn_blocking(merge).await {
        log::error!("taking the table's writes into its mirror: {e}");
    }
}
