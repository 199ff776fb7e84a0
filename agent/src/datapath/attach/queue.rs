//! The attach workers' queue: protection first, TCX upgrades after, one job per interface at a
//! time.
//!
//! Two lanes. `protect` holds what leaves an interface unprotected while it waits: a new
//! interface's first attach and the retries of failed ones. `upgrade` holds the swaps of a
//! netlink filter for a TCX link on interfaces that are already protected
//! ([`super::TcMode::NetlinkThenTcx`]). An upgrade is handed out only when nothing is waiting
//! in or running from the protect lane, only once start-up is done ([`JobQueue::start_upgrades`])
//! and only one at a time: a TCX link create holds `rtnl_lock` across an RCU grace period
//! (~16 ms), so the kernel runs them one after the other anyway, and every netlink request of a
//! protect job (qdisc, filter dump, filter add) would queue behind each one. One upgrade at a
//! time keeps that wait at one link create and leaves the other workers free.
//!
//! No two jobs for the same interface run at once (an upgrade and the attach of a rename, say):
//! a job waits while another job of its interface is out.
//!
//! Upgrades are also paced: after one that held the kernel for a while (a TCX link create
//! waits for an RCU grace period under `rtnl_lock`), the next waits as long as it took, so the
//! move never holds `rtnl_lock` back to back and every other rtnl user on the node (pod
//! creation, the CNI, other agents, ipq's own netlink filters) gets at least half of the time.
//! Measured in `cargo xtask bench` (a route burst during the move and after it).

use std::{
    collections::{BTreeSet, VecDeque},
    sync::{Condvar, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use super::{Job, JobKind};

#[derive(Debug, Default)]
struct Lanes {
    protect: VecDeque<Job>,
    upgrade: VecDeque<Job>,
    /// Interfaces with a job out at a worker.
    busy: BTreeSet<u32>,
    /// Protect jobs out at a worker.
    protecting: usize,
    /// Whether an upgrade is out at a worker.
    upgrading: bool,
    upgrades_started: bool,
    closed: bool,
    /// When the upgrade out at a worker was handed out.
    upgrade_taken_at: Option<Instant>,
    /// No upgrade is handed out before this (see the module's pacing).
    next_upgrade_at: Option<Instant>,
}

/// An upgrade shorter than this held nothing worth pacing (no grace period was waited for).
const PACE_ABOVE: Duration = Duration::from_millis(1);

impl Lanes {
    fn upgrade_paused(&self) -> bool {
        self.next_upgrade_at.is_some_and(|at| Instant::now() < at)
    }

    /// How long a worker should wait for the pacing of upgrades to let the next one out, if
    /// that is what holds it back.
    fn pause_left(&self) -> Option<Duration> {
        let at = self.next_upgrade_at?;
        (!self.upgrade.is_empty() && !self.upgrading)
            .then(|| at.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
    }

    fn take(&mut self) -> Option<Job> {
        if let Some(at) = self
            .protect
            .iter()
            .position(|j| !self.busy.contains(&j.ifindex))
        {
            let job = self.protect.remove(at)?;
            self.protecting += 1;
            self.busy.insert(job.ifindex);
            return Some(job);
        }
        if !self.upgrades_started
            || self.upgrading
            || self.protecting > 0
            || !self.protect.is_empty()
            || self.upgrade_paused()
        {
            return None;
        }
        let at = self
            .upgrade
            .iter()
            .position(|j| !self.busy.contains(&j.ifindex))?;
        let job = self.upgrade.remove(at)?;
        self.upgrading = true;
        self.upgrade_taken_at = Some(Instant::now());
        self.busy.insert(job.ifindex);
        Some(job)
    }
}

/// The queue the attacher fills and the workers empty.
#[derive(Debug, Default)]
pub struct JobQueue {
    lanes: Mutex<Lanes>,
    ready: Condvar,
}

impl JobQueue {
    fn lanes(&self) -> MutexGuard<'_, Lanes> {
        // A worker that panicked holding the lock left the lanes consistent (every change is
        // one push or pop): go on with them.
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job` in the lane of its kind. A repair or an upgrade of an interface that has
    /// one waiting already refreshes that one instead (it looks at the hooks when it runs,
    /// after this change too), keeping the newest generation so its report is not outdated. A
    /// protect job replaces a waiting one of its interface whole (a rename, a retry: the older
    /// one's report would be outdated), so each lane holds at most one job per interface: the
    /// queue is bounded by the interfaces wanted, however fast netlink renames them.
    pub fn push(&self, job: Job) {
        let mut lanes = self.lanes();
        let same = |queued: &Job| {
            queued.ifindex == job.ifindex
                && std::mem::discriminant(&queued.kind) == std::mem::discriminant(&job.kind)
        };
        match job.kind {
            // A repair restores protection: it goes with the attaches, before any upgrade.
            JobKind::Repair(_) => match lanes.protect.iter_mut().find(|q| same(q)) {
                Some(queued) => queued.generation = job.generation,
                None => lanes.protect.push_back(job),
            },
            JobKind::Upgrade => match lanes.upgrade.iter_mut().find(|q| same(q)) {
                Some(queued) => queued.generation = job.generation,
                None => lanes.upgrade.push_back(job),
            },
            JobKind::Protect => match lanes.protect.iter_mut().find(|q| same(q)) {
                Some(queued) => *queued = job,
                None => lanes.protect.push_back(job),
            },
        }
        drop(lanes);
        self.ready.notify_all();
    }

    /// Drops every queued job of `ifindex` (it went away or is no longer wanted). A job already
    /// out at a worker runs to its end; its report is outdated.
    pub fn cancel(&self, ifindex: u32) {
        let mut lanes = self.lanes();
        lanes.protect.retain(|j| j.ifindex != ifindex);
        lanes.upgrade.retain(|j| j.ifindex != ifindex);
    }

    /// Lets upgrades run: the agent calls it once start-up is done, so that no TCX link create
    /// competes for `rtnl_lock` with the netlink requests of the start-up itself.
    pub fn start_upgrades(&self) {
        self.lanes().upgrades_started = true;
        self.ready.notify_all();
    }

    /// Waits for the next job a worker may run; None once the queue is closed.
    pub fn take(&self) -> Option<Job> {
        let mut lanes = self.lanes();
        loop {
            if lanes.closed {
                return None;
            }
            if let Some(job) = lanes.take() {
                return Some(job);
            }
            lanes = match lanes.pause_left() {
                Some(left) => {
                    self.ready
                        .wait_timeout(lanes, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.ready.wait(lanes).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    /// The next job a worker may run, if there is one now (tests).
    #[cfg(test)]
    pub fn try_take(&self) -> Option<Job> {
        self.lanes().take()
    }

    /// A worker is done with `job`: its interface and its lane are free again.
    pub fn done(&self, job: &Job) {
        let mut lanes = self.lanes();
        lanes.busy.remove(&job.ifindex);
        match job.kind {
            JobKind::Protect | JobKind::Repair(_) => {
                lanes.protecting = lanes.protecting.saturating_sub(1);
            }
            JobKind::Upgrade => {
                lanes.upgrading = false;
                let took = lanes.upgrade_taken_at.take().map(|at| at.elapsed());
                lanes.next_upgrade_at = took
                    .filter(|took| *took > PACE_ABOVE)
                    .map(|took| Instant::now() + took);
            }
        }
        drop(lanes);
        self.ready.notify_all();
    }

    /// Ends every worker's wait: they return once their current job is done.
    pub fn close(&self) {
        self.lanes().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::attach::Role;

    fn job(ifindex: u32, kind: JobKind) -> Job {
        Job {
            ifindex,
            name: format!("veth{ifindex}"),
            role: Role::Workload,
            kind,
            generation: 1,
        }
    }

    #[test]
    fn upgrades_wait_for_start_up_and_for_every_protect_job_and_run_one_at_a_time() {
        let queue = JobQueue::default();
        queue.push(job(1, JobKind::Upgrade));
        queue.push(job(2, JobKind::Upgrade));
        queue.push(job(3, JobKind::Protect));
        assert_eq!(
            queue.try_take().map(|j| j.ifindex),
            Some(3),
            "protect first"
        );
        assert!(
            queue.try_take().is_none(),
            "no upgrade before start-up is done"
        );
        queue.start_upgrades();
        assert!(
            queue.try_take().is_none(),
            "no upgrade while a protect job is out"
        );
        queue.done(&job(3, JobKind::Protect));
        let upgrade = queue.try_take().expect("an upgrade");
        assert_eq!(upgrade.ifindex, 1);
        assert!(queue.try_take().is_none(), "one upgrade at a time");
        // A new interface goes out at once, beside the running upgrade.
        queue.push(job(4, JobKind::Protect));
        assert_eq!(queue.try_take().map(|j| j.ifindex), Some(4));
        queue.done(&upgrade);
        assert!(
            queue.try_take().is_none(),
            "the next upgrade waits for the protect job"
        );
        queue.done(&job(4, JobKind::Protect));
        assert_eq!(queue.try_take().map(|j| j.ifindex), Some(2));
    }

    #[test]
    fn jobs_of_a_busy_interface_wait_and_cancelled_ones_never_run() {
        let queue = JobQueue::default();
        queue.start_upgrades();
        queue.push(job(1, JobKind::Upgrade));
        let upgrade = queue.try_take().expect("the upgrade");
        queue.push(job(1, JobKind::Protect));
        queue.push(job(2, JobKind::Protect));
        assert_eq!(
            queue.try_take().map(|j| j.ifindex),
            Some(2),
            "if1's protect job waits for its upgrade"
        );
        queue.done(&upgrade);
        assert_eq!(queue.try_take().map(|j| j.ifindex), Some(1));

        queue.push(job(5, JobKind::Protect));
        queue.push(job(5, JobKind::Upgrade));
        queue.cancel(5);
        assert!(queue.try_take().is_none());
    }

    #[test]
    fn after_an_upgrade_that_held_the_kernel_the_next_waits_as_long_as_it_took() {
        let queue = std::sync::Arc::new(JobQueue::default());
        queue.start_upgrades();
        queue.push(job(1, JobKind::Upgrade));
        queue.push(job(2, JobKind::Upgrade));
        let first = queue.try_take().expect("the first upgrade");
        // As if its TCX link create had waited 300 ms for a grace period.
        queue.lanes().upgrade_taken_at = Some(Instant::now() - Duration::from_millis(300));
        queue.done(&first);
        assert!(
            queue.try_take().is_none(),
            "paced: rtnl_lock is not held back to back"
        );
        // A protect job is not paced.
        queue.push(job(3, JobKind::Protect));
        assert_eq!(queue.try_take().map(|j| j.ifindex), Some(3));
        queue.done(&job(3, JobKind::Protect));
        // A waiting worker gets the upgrade once the pause is over, without a new push.
        let not_before = queue.lanes().next_upgrade_at.expect("a pause");
        let next = queue.take().expect("the next upgrade");
        assert_eq!(next.ifindex, 2);
        assert!(
            Instant::now() >= not_before,
            "handed out before its pause ended"
        );
    }

    #[test]
    fn a_second_upgrade_or_repair_of_an_interface_refreshes_the_waiting_one() {
        let queue = JobQueue::default();
        queue.push(job(1, JobKind::Upgrade));
        queue.push(Job {
            generation: 7,
            ..job(1, JobKind::Upgrade)
        });
        queue.push(job(
            1,
            JobKind::Repair(crate::datapath::attach::Lost::Filter),
        ));
        queue.push(Job {
            generation: 9,
            ..job(1, JobKind::Repair(crate::datapath::attach::Lost::Qdisc))
        });
        let repair = queue.try_take().expect("the repair");
        assert_eq!(
            (repair.kind, repair.generation),
            (JobKind::Repair(crate::datapath::attach::Lost::Filter), 9),
            "one repair, of the first cause, with the newest generation"
        );
        queue.done(&repair);
        queue.start_upgrades();
        let upgrade = queue.try_take().expect("the upgrade");
        assert_eq!(upgrade.generation, 7);
        queue.done(&upgrade);
        assert!(queue.try_take().is_none(), "no second one");
    }

    /// An interface renamed over and over while the workers are busy waits as one protect job,
    /// the newest: the queue does not grow with the renames.
    #[test]
    fn a_newer_protect_job_of_an_interface_replaces_the_waiting_one() {
        let queue = JobQueue::default();
        for generation in 1..=1000 {
            queue.push(Job {
                name: format!("rename{generation}"),
                generation,
                ..job(1, JobKind::Protect)
            });
        }
        queue.push(job(2, JobKind::Protect));
        let first = queue.try_take().expect("interface 1's job");
        assert_eq!(
            (first.name.as_str(), first.generation),
            ("rename1000", 1000)
        );
        let second = queue.try_take().expect("interface 2's job");
        assert_eq!(second.ifindex, 2);
        queue.done(&first);
        queue.done(&second);
        assert!(queue.try_take().is_none(), "one job per interface");
    }

    #[test]
    fn a_closed_queue_ends_the_wait() {
        let queue = std::sync::Arc::new(JobQueue::default());
        let waiter = {
            let queue = queue.clone();
            std::thread::spawn(move || queue.take())
        };
        queue.close();
        assert!(waiter.join().unwrap().is_none());
    }
}
