//! A release the owner loop asks for at once (pool pressure, `release-quietest`), run by the
//! releaser between its scans.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use log::{error, warn};

use super::{
    attachments::{addresses_by_attachment, whole, Attachment},
    memory::Known,
    release, scan, Retry,
};
use crate::{
    api::{command::Reply, model::ExhaustedAnswer},
    ipam::{holds::Holds, store::Handed, trust::TrustedBins},
    metrics::Metrics,
};

/// A release the owner loop asks for at once (pool pressure, `release-quietest`): the held
/// allocation of `container_id`/`ifname`, whose every address it found quarantined or free.
/// `answer` goes back to ipq-ipam with `released` cleared if the delegate's DEL failed.
pub struct Urgent {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub answer: ExhaustedAnswer,
    pub reply: Reply<ExhaustedAnswer>,
}

/// Runs `urgent`'s release at once and answers whether it happened.
pub(super) async fn release_now(
    dir: &Path,
    urgent: Urgent,
    metrics: &Metrics,
    (retries, known, handed): (&mut HashMap<PathBuf, Retry>, &mut Known, &Handed),
    holds: &Holds,
    bins: &Arc<TrustedBins>,
) {
    let Urgent {
        network,
        container_id,
        ifname,
        mut answer,
        reply,
    } = urgent;
    let pending = scan(dir, (known, handed), metrics)
        .await
        .unwrap_or_default();
    let held = addresses_by_attachment(&pending);
    let (mine, others): (Vec<_>, Vec<_>) = pending
        .into_iter()
        .partition(|s| s.request.container_id == container_id && s.request.ifname == ifname);
    let outcome = match mine.into_iter().next() {
        // Released by the last scan already: the delegate has the address back.
        None => "released",
        Some(spooled) => {
            // As in the scan: forgotten (with the attachment's other releases) before the DEL,
            // put back if it fails.
            let attachment = Attachment::of(&spooled.request);
            let addresses = held.get(&attachment).map_or(&[][..], Vec::as_slice);
            holds.forget(addresses);
            let whole = whole(&spooled.request, addresses);
            if release(spooled, metrics, (retries, known), bins, holds, &whole).await {
                // The attachment's other releases (one per DEL the runtime retried) are done.
                for other in others {
                    if Attachment::of(&other.request) == attachment {
                        if let Err(e) = known.done(other) {
                            error!("ipam releases: {e}");
                        }
                    }
                }
                "released"
            } else {
                answer.released.clear();
                "release_failed"
            }
        }
    };
    let label = metrics.ipam.event_network_label(Some(&network));
    metrics
        .ipam_exhausted
        .with_label_values(&[label.as_str(), outcome])
        .inc();
    warn!(
        "ipam: network {network:?} exhausted: released the quietest held allocation \
         (container {container_id}, {ifname}): {outcome}"
    );
    let _ = reply.send(Ok(answer));
}
