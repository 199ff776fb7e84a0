//! Operations on several addresses at once, all or none: a pod's IPv4 and IPv6 addresses are
//! claimed together, and a refusal of one must not leave the other claimed.

use std::{collections::HashSet, net::IpAddr};

use super::{AddrRecord, Clock, Effect, Holder, Registry, RegistryError, Source};

impl<C: Clock> Registry<C> {
    /// `holder` claims every address in `addrs` as [`claim`](Self::claim) would, or none of
    /// them: when one fails, the records already changed are put back as they were and the
    /// error is returned. (The refusal itself still counts in
    /// [`Refusals::refused_claims`](super::Refusals::refused_claims): it happened.)
    pub fn claim_all(
        &mut self,
        addrs: &[IpAddr],
        holder: &Holder,
        source: Source,
    ) -> Result<Vec<Effect>, RegistryError> {
        let mut saved: Vec<(IpAddr, Option<AddrRecord>)> = Vec::with_capacity(addrs.len());
        // Which records are saved already: a claim may name thousands of addresses, and
        // searching `saved` for each would be quadratic in them.
        let mut seen: HashSet<IpAddr> = HashSet::with_capacity(addrs.len());
        let mut out = Vec::new();
        for &addr in addrs {
            let key = addr.to_canonical();
            if seen.insert(key) {
                saved.push((key, self.records().record(&key).cloned()));
            }
            match self.claim(addr, holder.clone(), source) {
                Ok(effects) => out.extend(effects),
                Err(e) => {
                    // The effects of the earlier claims were never applied: putting the
                    // records back is enough, and what that emits is discarded with them.
                    let mut discarded = Vec::new();
                    let book = self.lifecycle.records_mut();
                    for (addr, before) in saved.into_iter().rev() {
                        book.put(addr, before, &mut discarded);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }
}
