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
//! O(pins): a few syscalls per pin, about 0.5 µs each; the pass's duration is a gauge
//! (`ipq_datapath_verify_seconds`) and is shown in `ipq status`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::mpsc;

use super::held_pins::{self, Restored, TcxPlace};
use crate::paths::{AttachPoint, PinLayout};

/// One pass's findings.
#[derive(Debug)]
pub struct Verification {
    pub finished_at: SystemTime,
    pub took: Duration,
    /// Pins the agent holds, all checked.
    pub pins: usize,
    /// Pins someone else removed or replaced (pinned back, or why not).
    pub restored: Vec<Restored>,
    /// Held links no longer attached to their device: (ifindex, hook).
    pub detached: Vec<(u32, AttachPoint)>,
    /// Held TCX links that something was attached before: (ifindex, hook).
    pub behind: Vec<(u32, AttachPoint)>,
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
    pub fn summary(&self) -> Summary {
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
        found.extend(self.detached.iter().map(|(ifindex, point)| {
            format!("if{ifindex} {} link detached: repairing", point.as_str())
        }));
        found.extend(self.behind.iter().map(|(ifindex, point)| {
            format!(
                "if{ifindex} {}: another program runs before ipq's: moving ipq's first",
                point.as_str()
            )
        }));
        Summary {
            finished_at: self.finished_at,
            took: self.took,
            pins: self.pins,
            found,
        }
    }
}

/// One pass over the pins under `root` (one `bpffs_dir`).
pub fn verify(root: &Path) -> Verification {
    let started = Instant::now();
    let restored = held_pins::restore(root);
    held_pins::report(&restored);
    let links_dir = PinLayout::new(root).links_dir();
    let held = held_pins::held_under(root);
    let (mut detached, mut behind) = (Vec::new(), Vec::new());
    for path in held
        .iter()
        .filter(|path| path.parent() == Some(links_dir.as_path()))
    {
        let Some(link) = path
            .file_name()
            .and_then(|name| PinLayout::parse_link_name(name.to_str()?))
        else {
            continue;
        };
        let (ifindex, point) = link;
        // One question to the kernel per link: each takes rtnl_lock, which every pod
        // creation on the node needs too.
        let place = match point {
            AttachPoint::Xdp => match held_pins::link_attached(path) {
                Some(false) => Some(TcxPlace::Absent),
                _ => None,
            },
            _ => held_pins::tcx_place(path, ifindex, point),
        };
        match place {
            Some(TcxPlace::Absent) => detached.push(link),
            Some(TcxPlace::Behind) => behind.push(link),
            Some(TcxPlace::First) | None => {}
        }
    }
    Verification {
        finished_at: SystemTime::now(),
        took: started.elapsed(),
        pins: held.len(),
        restored,
        detached,
        behind,
    }
}

/// Verifies every `every` for as long as the agent runs, each pass's findings sent to the
/// owner loop (a pass is skipped while the loop has not taken the last one).
pub async fn run(root: PathBuf, every: Duration, findings: mpsc::Sender<Verification>) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let root = root.clone();
        match tokio::task::spawn_blocking(move || verify(&root)).await {
            Ok(verification) => {
                if findings.try_send(verification).is_err() && findings.is_closed() {
                    return;
                }
            }
            Err(e) => log::error!("verifying the datapath: {e}"),
        }
    }
}
