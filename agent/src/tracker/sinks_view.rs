//! What the API shows of the sinks' state ([`Sinks`]): the datapath writes the kernel refused,
//! how a claim's conntrack entries are flushed, and, in an address's view, its last reuse
//! hygiene pass and its refused write.

use std::net::IpAddr;

use super::{effects::Sinks, hygiene::hygiene_view};
use crate::api::{
    model::{AddressView, ClaimFlushView, PendingWriteView},
    views::TimeBase,
};

/// Pending datapath writes `/v1/status` lists (all are counted).
const PENDING_WRITES_SHOWN: usize = 16;

/// What `/v1/status` says of the sinks.
pub(super) struct SinksStatus {
    pub(super) conntrack_claim_flush: Option<ClaimFlushView>,
    pub(super) writes_pending: u64,
    /// The first of them, in address order.
    pub(super) pending_writes: Vec<PendingWriteView>,
}

impl Sinks {
    /// `/v1/status`'s part: O(pending writes), and those are few unless the kernel refuses
    /// every write.
    pub(super) fn status(&self) -> SinksStatus {
        let pending = self.enforcer.pending();
        SinksStatus {
            conntrack_claim_flush: self.hygiene.claim_flush().map(|f| ClaimFlushView {
                ipv4: f.ipv4,
                ipv6: f.ipv6,
            }),
            writes_pending: pending.len() as u64,
            pending_writes: pending.views(PENDING_WRITES_SHOWN),
        }
    }

    /// An address's last hygiene pass and its refused datapath write, in its view.
    pub(super) fn annotate(&self, view: &mut AddressView, time: &TimeBase) {
        view.last_flush = self
            .hygiene
            .last(view.address)
            .map(|r| hygiene_view(&r, Some(time)));
        view.pending_write = self
            .enforcer
            .pending()
            .get(view.address)
            .map(|p| p.view(view.address));
    }

    /// A free address whose entry the kernel refused to delete: the datapath still enforces
    /// its old entry, and its view says so rather than 404.
    pub(super) fn unwritten_free_view(&self, addr: IpAddr) -> Option<AddressView> {
        let pending = self.enforcer.pending().get(addr)?;
        Some(AddressView {
            pending_write: Some(pending.view(addr)),
            ..AddressView::free(addr)
        })
    }
}
