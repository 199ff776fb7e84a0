//! The agent's side of ipq-ipam: it runs the delegate's DEL of each held allocation once every
//! address of it is free again, and never before.
//!
//! Pending releases are the files ipq-ipam wrote under `state_dir/ipam-releases` (written
//! atomically and fsynced before its DEL succeeded, one per release), so they survive restarts
//! and a SIGKILL; a file goes only after its delegate DEL succeeded. "Free" is the registry's
//! word: an address leaves the registry when its quarantine is over (cooldown, quiet period,
//! max), and one ipq never saw used was never in it. A release runs again after a crash between
//! its DEL and the file's removal: delegate DELs are idempotent (host-local frees by container
//! id and ifname, which no later pod shares).
//!
//! The releases of one attachment (a runtime retrying its DEL) are one hold: the delegate's DEL
//! frees the attachment whole, so it runs only once every address any of them names is free.
//! An attachment none of whose releases names an address (a DEL without prevResult, spooled
//! while the agent was away, whose holder is gone by now) cannot be asked about by address:
//! the registry indexes attachments by their live holder only. It waits `max_cooldown` past
//! the later of the release's own time (stamped when stored, persisted in its file) and the
//! last moment it was seen busy: no quarantine lasts longer than that ([`memory`]).
//!
//! Every wait counts in CLOCK_BOOTTIME (`kernel_clock::boottime_ns`), which a wall-clock step
//! does not move. A release's file keeps its boot id beside its boottime stamp; within that
//! boot the stamp counts, and across a reboot (another boot id, or none) the wait starts again
//! from when this releaser first saw the release: never early, whatever the wall clock did
//! meanwhile. The wall-clock stamp (`held_at_unix_ms`) is kept for people, not for deciding.
//!
//! The releaser keeps the pending releases in memory too, from the moment the store's thread
//! answered them as stored ([`super::store::Handed`]): a file removed behind its back is
//! written back at the next scan, never silently lost ([`memory`]).
//!
//! The delegate is run only from the CNI bin directories the agent trusts (`ipam_cni_bin_dirs`,
//! [`super::trust`]): the release names its binary, and the agent runs it as root. A release
//! whose delegate is not trusted (spooled while the agent was away) fails like a failing DEL:
//! it stays held, counted and retried, never dropped and never released another way.
//!
//! This task runs off the owner loop: it scans the directory and runs the delegates itself,
//! and asks the loop one O(k) question per release (`Command::AllocationBusy`). It starts only
//! once the registry is recovered and ipq-cni's spool replayed, so a journal not yet read never
//! answers "free".

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use ipq_api::model::{HeldRelease, InvalidRelease};
use ipq_delegate::{self as delegate, error::CniError};
use ipq_fs::spool::{self, Spooled};
use log::{debug, error, warn};
use tokio::sync::{mpsc, oneshot};

use self::{
    attachments::{addresses_by_attachment, whole, Attachment},
    gauges::{set_failing, set_held_addresses},
    memory::Known,
    urgent::release_now,
};
use super::{
    holds::Holds,
    records::Records,
    store::Handed,
    trust::{TrustError, TrustedBins},
};
use crate::{
    api::command::{AllocationQuery, Command},
    kernel_clock,
    metrics::Metrics,
};

mod attachments;
mod gauges;
mod memory;
mod urgent;

pub use urgent::Urgent;

/// How often pending releases are looked at again.
const POLL: Duration = Duration::from_secs(1);
/// The first retry of a failed delegate DEL; doubled per failure up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Why one release did not happen.
#[derive(Debug, thiserror::Error)]
enum ReleaseError {
    #[error(transparent)]
    Delegate(#[from] CniError),
    #[error("the delegate's DEL did not finish: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// A spooled release the API would have refused (written by an older ipq-ipam, or by hand).
    #[error("the release is not runnable: {0}")]
    Invalid(#[from] InvalidRelease),
    #[error(transparent)]
    Untrusted(#[from] TrustError),
}

/// A failed release waiting for its next try.
struct Retry {
    failures: u32,
    next: Instant,
    last_error: String,
}

fn backoff(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(MAX_RETRY)
}

/// How long `release` must still wait whatever the registry says. A registry rebuilt without
/// its journal (`registry_lost_at`, CLOCK_BOOTTIME ns of this boot) cannot vouch for a release
/// handed over before it started: an address it never heard of may be one whose quarantine it
/// forgot. Such a release waits `max_cooldown` from its hand-over, since no quarantine lasts
/// longer; from the loss when its hand-over is not known in this boot's clock (another boot's,
/// an older agent's, one ipq-ipam spooled while the agent was away): the safe side.
fn unvouched_wait(
    release: &HeldRelease,
    registry_lost_at: Option<u64>,
    max_cooldown: Duration,
    (now_ns, boot_id): (u64, Option<&str>),
) -> Duration {
    let Some(lost_at) = registry_lost_at else {
        return Duration::ZERO;
    };
    let held_at = match held_in_this_boot(release, boot_id) {
        None => lost_at,
        Some(at) if at >= lost_at => return Duration::ZERO,
        Some(at) => at,
    };
    let until = held_at.saturating_add(u64::try_from(max_cooldown.as_nanos()).unwrap_or(u64::MAX));
    Duration::from_nanos(until.saturating_sub(now_ns))
}

/// When `release` was handed over, in CLOCK_BOOTTIME ns, if it was in boot `boot_id` (this
/// one): a stamp of another boot counts from another origin and says nothing here.
fn held_in_this_boot(release: &HeldRelease, boot_id: Option<&str>) -> Option<u64> {
    let stamp = release.held_at_boot.as_ref()?;
    (Some(stamp.boot_id.as_str()) == boot_id).then_some(stamp.boottime_ns)
}

/// What the releaser is started with, besides its channels and the tables it shares.
pub struct Settings {
    /// `state_dir/ipam-releases`.
    pub dir: PathBuf,
    pub max_cooldown: Duration,
    /// Set when the registry was rebuilt without its journal (CLOCK_BOOTTIME ns; see
    /// [`unvouched_wait`]).
    pub registry_lost_at: Option<u64>,
    /// The releases the store's thread answered as stored, for this task to remember.
    pub handed: Handed,
    /// Where delegates may be run from (`ipam_cni_bin_dirs`).
    pub bins: Arc<TrustedBins>,
    /// The records of ipq-ipam's allocations: adopted at each scan, forgotten once released.
    pub records: Records,
}

/// Runs until the owner loop stops answering. `urgent` brings the releases the owner loop
/// wants now, run between two scans (this task is the one that runs delegate DELs).
pub async fn run(
    settings: Settings,
    commands: mpsc::Sender<Command>,
    mut urgent: mpsc::Receiver<Urgent>,
    metrics: Arc<Metrics>,
    holds: Holds,
) {
    let Settings {
        dir,
        max_cooldown,
        registry_lost_at,
        handed,
        bins,
        records,
    } = settings;
    let boot_id = kernel_clock::boot_id();
    let mut retries: HashMap<PathBuf, Retry> = HashMap::new();
    let mut known = Known::new(records, boot_id.clone());
    let mut networks: HashSet<String> = HashSet::new();
    loop {
        if let Some(pending) = scan(&dir, (&mut known, &handed), &metrics).await {
            metrics
                .ipam_pending_releases
                .set(i64::try_from(pending.len()).unwrap_or(i64::MAX));
            set_held_addresses(&metrics, &pending, &mut networks);
            let failures = retries
                .iter()
                .map(|(path, r)| (path.clone(), (r.failures, Some(r.last_error.clone()))))
                .collect();
            holds.replace(&pending, &failures);
            let paths: HashSet<&Path> = pending.iter().map(|p| p.path.as_path()).collect();
            retries.retain(|path, _| paths.contains(path.as_path()));
            set_failing(&metrics, &retries);
            let held = addresses_by_attachment(&pending);
            let mut released: HashSet<Attachment> = HashSet::new();
            for spooled in pending {
                let attachment = Attachment::of(&spooled.request);
                if released.contains(&attachment) {
                    // Its DEL ran for an earlier release of the same attachment.
                    debug!(
                        "ipam: a second release of container {} ({}) was done by the first",
                        spooled.request.container_id, spooled.request.ifname
                    );
                    if let Err(e) = known.done(spooled) {
                        error!("ipam releases: {e}");
                    }
                    continue;
                }
                if retries
                    .get(&spooled.path)
                    .is_some_and(|r| Instant::now() < r.next)
                {
                    continue;
                }
                let wait = unvouched_wait(
                    &spooled.request,
                    registry_lost_at,
                    max_cooldown,
                    (kernel_clock::boottime_ns(), boot_id.as_deref()),
                );
                if !wait.is_zero() {
                    continue;
                }
                // The attachment's every address: its DEL frees them all, so a release naming
                // only a free one must not free the others early.
                let addresses = held.get(&attachment).map_or(&[][..], Vec::as_slice);
                let whole = whole(&spooled.request, addresses);
                let free = match all_free(&commands, &whole).await {
                    None => return,
                    Some(free) => free,
                };
                let ready = if addresses.is_empty() {
                    known.quiet_long_enough(
                        &spooled.path,
                        !free,
                        kernel_clock::boottime_ns(),
                        max_cooldown,
                    )
                } else {
                    free
                };
                if !ready {
                    continue;
                }
                // Forgotten before the DEL runs, with the other releases of the attachment:
                // the delegate hands the address out only once its DEL is done, and an ADD
                // that gets it then must not find ipq's hold still there (it would park the
                // address as held for another). A DEL that fails puts the hold back as soon
                // as it returns.
                holds.forget(addresses);
                let done = release(
                    spooled,
                    &metrics,
                    (&mut retries, &mut known),
                    &bins,
                    &holds,
                    &whole,
                )
                .await;
                if done {
                    released.insert(attachment);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            Some(now) = urgent.recv() => {
                let memory = (&mut retries, &mut known, &handed);
                release_now(&dir, now, &metrics, memory, &holds, &bins).await;
            }
        }
    }
}

/// The pending releases, read off the async threads and merged with what `known` remembers
/// (a vanished file written back); None (logged) when the directory cannot be read. The
/// releases `handed` over since the last scan are taken before the directory is read: one
/// stored meanwhile is not in the listing and must not be taken for one that vanished.
async fn scan(
    dir: &Path,
    (known, handed): (&mut Known, &Handed),
    metrics: &Metrics,
) -> Option<Vec<Spooled<HeldRelease>>> {
    known.remember(handed.take(), kernel_clock::boottime_ns());
    let dir = dir.to_owned();
    let records = known.records().clone();
    let read = move || {
        // ipq-ipam's records written while the agent was away.
        records.adopt();
        spool::pending_of::<HeldRelease>(&dir)
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(scanned)) => Some(known.reconcile(scanned, kernel_clock::boottime_ns(), metrics)),
        Ok(Err(e)) => {
            error!("ipam releases: {e}");
            None
        }
        Err(e) => {
            error!("ipam releases: scanning stopped: {e}");
            None
        }
    }
}

/// Whether every address of `release` is free; None when the owner loop is gone.
async fn all_free(commands: &mpsc::Sender<Command>, release: &HeldRelease) -> Option<bool> {
    let (reply, answer) = oneshot::channel();
    let query = AllocationQuery {
        container_id: release.container_id.clone(),
        ifname: release.ifname.clone(),
        addresses: release.addresses.clone(),
    };
    commands
        .send(Command::AllocationBusy { query, reply })
        .await
        .ok()?;
    match answer.await.ok()? {
        Ok(busy) => Some(busy.addresses.is_empty()),
        Err(e) => {
            warn!(
                "ipam release of container {}: the registry did not answer ({}); kept",
                release.container_id, e.0.message
            );
            Some(false)
        }
    }
}

/// Runs the delegate's DEL of `spooled` and removes it; a failure is counted, logged, retried
/// with backoff, and `whole`'s hold (the attachment's) put back in `holds`. Whether it
/// succeeded.
async fn release(
    spooled: Spooled<HeldRelease>,
    metrics: &Metrics,
    (retries, known): (&mut HashMap<PathBuf, Retry>, &mut Known),
    bins: &Arc<TrustedBins>,
    holds: &Holds,
    whole: &HeldRelease,
) -> bool {
    // What runs is the allocation's record where there is one (a release spooled by
    // ipq-ipam while the agent was away was checked against nothing).
    let request = &spooled.request;
    let held = match known.records().get(
        request.network.as_deref(),
        &request.container_id,
        &request.ifname,
    ) {
        Some(record) => record.release_at(request.held_at_unix_ms),
        None => request.clone(),
    };
    let network = metrics.ipam.event_network_label(held.network.as_deref());
    let bins = Arc::clone(bins);
    let outcome = tokio::task::spawn_blocking(move || run_del(&held, &bins))
        .await
        .map_err(ReleaseError::from)
        .and_then(|r| r);
    let released = outcome.is_ok();
    let request = &spooled.request;
    match outcome {
        Ok(()) => {
            metrics
                .ipam_releases
                .with_label_values(&[network.as_str(), "released"])
                .inc();
            debug!(
                "ipam: released the allocation of container {} ({}) in network {network:?}: \
                 {} DEL done for {:?}",
                request.container_id, request.ifname, request.delegate_type, request.addresses
            );
            retries.remove(&spooled.path);
            // Left behind, the file only runs the (idempotent) DEL again next time.
            if let Err(e) = known.done(spooled) {
                error!("ipam releases: {e}");
            }
        }
        Err(e) => {
            metrics
                .ipam_releases
                .with_label_values(&[network.as_str(), "failed"])
                .inc();
            let retry = retries.entry(spooled.path.clone()).or_insert(Retry {
                failures: 0,
                next: Instant::now(),
                last_error: String::new(),
            });
            retry.failures += 1;
            retry.last_error = e.to_string();
            holds.put_back(whole, retry.failures, &retry.last_error);
            let wait = backoff(retry.failures);
            retry.next = Instant::now() + wait;
            warn!(
                "ipam: the {} DEL of container {} ({}) failed {} times, retried in {wait:?}: {e}",
                request.delegate_type, request.container_id, request.ifname, retry.failures
            );
        }
    }
    set_failing(metrics, retries);
    released
}

/// The delegate's DEL, as a runtime would have run it, from a directory the agent trusts: the
/// binary opened and checked once, and that descriptor executed. A release refused here stays
/// held and is retried: it is never dropped (the address would stay allocated for good
/// without a word) nor released another way (early).
fn run_del(release: &HeldRelease, bins: &TrustedBins) -> Result<(), ReleaseError> {
    release.validate()?;
    let opened = bins.open(release)?;
    exec_opened(release, &opened)
}

/// Runs the delegate's DEL from the descriptor the trust check held: whatever its path names
/// by now, the file checked is the file run.
fn exec_opened(
    release: &HeldRelease,
    opened: &crate::ipam::trust::Opened,
) -> Result<(), ReleaseError> {
    use std::os::fd::AsFd as _;
    let stdin = release.delegate_conf.to_string();
    delegate::exec_fd(
        &release.delegate_type,
        opened.fd.as_fd(),
        &opened.path,
        &release.del_env(),
        stdin.as_bytes(),
    )
    .map(|_| ())
    .map_err(ReleaseError::from)
}

#[cfg(test)]
mod tests;
