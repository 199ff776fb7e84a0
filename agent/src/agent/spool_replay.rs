//! The CNI spool: DELs that `ipq-cni` could not hand to an agent, replayed at start and on
//! every tick.

use ipq_fs::spool;
use log::{error, info, warn};

use crate::tracker::{Durable, Tracker};

/// Drains what `ipq-cni` spooled when it could not reach an agent.
pub(super) fn replay_spool(tracker: &mut Tracker, durable: &mut Durable, dir: &std::path::Path) {
    let pending = match spool::pending(dir) {
        Ok(pending) => pending,
        Err(e) => {
            error!("CNI spool: {e}");
            return;
        }
    };
    for spooled in pending {
        let drained = tracker.drain_attachment(&spooled.request);
        info!(
            "CNI spool: replayed the DEL of container {} ({} addresses drained)",
            spooled.request.container_id,
            drained.len()
        );
        // Saved before the spool file goes, so a crash in between replays it again (harmless:
        // draining is idempotent) rather than losing it. A failed save keeps every file left:
        // the next tick replays them.
        if let Err(reason) = durable.persist(tracker.journaled()) {
            warn!(
                "CNI spool: the DEL of container {} is kept for a later replay: the journal \
                 could not be saved ({reason})",
                spooled.request.container_id
            );
            return;
        }
        if let Err(e) = spooled.done() {
            error!("CNI spool: {e}");
        }
    }
}
