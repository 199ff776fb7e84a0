//! The registry's waitlist: holders it refused because it was full, whose addresses are seen
//! but not protected. They wait here, oldest first, and are claimed as space frees — one per
//! freed record, so no event ever scans the registry or the node's routes.
//!
//! The list is bounded. Past its bound the newest are not kept but counted, and the next time
//! the list runs dry while space frees, the owner rescans the node's routes once.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::IpAddr,
};

use super::{Clock, Effect, Holder, Registry, RegistryError, Source};

/// Claimants kept at most; ~100 bytes each.
pub const MAX_PENDING: usize = 65_536;

#[derive(Debug)]
pub struct Waitlist {
    /// (address, interface) in arrival order; an entry whose holder was forgotten is skipped
    /// when it reaches the front.
    order: VecDeque<(IpAddr, u32)>,
    holders: HashMap<(IpAddr, u32), Holder>,
    /// Interface → the addresses waiting on it: an interface going away forgets its own
    /// claimants, not a scan of the whole queue.
    of_interface: HashMap<u32, HashSet<IpAddr>>,
    bound: usize,
    /// Claimants refused while the queue was at its bound.
    overflowed: usize,
}

impl Default for Waitlist {
    fn default() -> Self {
        Self::with_bound(MAX_PENDING)
    }
}

impl Waitlist {
    pub fn with_bound(bound: usize) -> Self {
        Self {
            order: VecDeque::new(),
            holders: HashMap::new(),
            of_interface: HashMap::new(),
            bound,
            overflowed: 0,
        }
    }

    /// Addresses seen but not protected: those waiting, plus those the bound left out.
    pub fn len(&self) -> usize {
        self.holders.len() + self.overflowed
    }

    /// Nothing waits and nothing was left out.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.overflowed == 0
    }

    /// Whether the bound left claimants out (the owner rescans once the queue is empty).
    pub fn overflowed(&self) -> bool {
        self.overflowed > 0
    }

    /// Forgets the overflow count: the owner is rescanning.
    pub(super) fn clear_overflow(&mut self) {
        self.overflowed = 0;
    }

    /// Queues `holder`'s claim of `addr`; returns whether it is new.
    pub fn push(&mut self, addr: IpAddr, holder: Holder) -> bool {
        let key = (addr, holder.ifindex);
        if let Some(known) = self.holders.get_mut(&key) {
            *known = holder;
            return false;
        }
        if self.holders.len() >= self.bound {
            self.overflowed += 1;
            return true;
        }
        self.holders.insert(key, holder);
        self.index(key);
        self.order.push_back(key);
        true
    }

    /// Puts back a claimant that still did not fit, at the front.
    pub(super) fn push_front(&mut self, addr: IpAddr, holder: Holder) {
        let key = (addr, holder.ifindex);
        if self.holders.insert(key, holder).is_none() {
            self.index(key);
            self.order.push_front(key);
        }
    }

    /// The oldest claimant still waiting.
    pub(super) fn pop(&mut self) -> Option<(IpAddr, Holder)> {
        while let Some(key) = self.order.pop_front() {
            if let Some(holder) = self.holders.remove(&key) {
                self.unindex(key);
                return Some((key.0, holder));
            }
        }
        None
    }

    /// `addr` is no longer shown on `ifindex` (its route went away).
    pub fn forget(&mut self, addr: IpAddr, ifindex: u32) {
        if self.holders.remove(&(addr, ifindex)).is_some() {
            self.unindex((addr, ifindex));
        }
        self.compact();
    }

    /// Interface `ifindex` went away with every claim it made: O(its claims).
    pub fn forget_interface(&mut self, ifindex: u32) {
        let Some(addrs) = self.of_interface.remove(&ifindex) else {
            return;
        };
        for addr in addrs {
            self.holders.remove(&(addr, ifindex));
        }
        self.compact();
    }

    fn index(&mut self, (addr, ifindex): (IpAddr, u32)) {
        self.of_interface.entry(ifindex).or_default().insert(addr);
    }

    fn unindex(&mut self, (addr, ifindex): (IpAddr, u32)) {
        if let Some(addrs) = self.of_interface.get_mut(&ifindex) {
            addrs.remove(&addr);
            if addrs.is_empty() {
                self.of_interface.remove(&ifindex);
            }
        }
    }

    /// Whether the interface index lists exactly the waiting claimants; for tests.
    #[cfg(test)]
    pub(super) fn check_index(&self) -> Result<(), crate::invariant::InvariantViolation> {
        let mut rebuilt: HashMap<u32, HashSet<IpAddr>> = HashMap::new();
        for (addr, ifindex) in self.holders.keys() {
            rebuilt.entry(*ifindex).or_default().insert(*addr);
        }
        crate::invariant::same_index("waitlist interface index", &self.of_interface, &rebuilt)
    }

    /// Drops forgotten keys once they are most of the order queue, so it stays within twice
    /// the live entries (amortised O(1) per forget).
    fn compact(&mut self) {
        if self.order.len() > 2 * self.holders.len() + 16 {
            let holders = &self.holders;
            self.order.retain(|key| holders.contains_key(key));
        }
    }
}

/// What a run of the waitlist did ([`Registry::claim_waiting`]).
#[derive(Debug, Default)]
pub struct WaitlistRun {
    /// The effects of the claims that fit.
    pub effects: Vec<Effect>,
    pub claimed: usize,
    /// The bound left claimants out and the list ran dry: the owner rescans the node once.
    pub rescan: bool,
}

impl<C: Clock> Registry<C> {
    /// Space freed (`freed` records): the waiting claims are tried again, oldest first, those
    /// whose holder still shows the address (`still_shown`), at most `freed` of them.
    pub fn claim_waiting(
        &mut self,
        freed: usize,
        still_shown: impl Fn(IpAddr, u32) -> bool,
    ) -> WaitlistRun {
        let mut run = WaitlistRun::default();
        if self.waitlist.is_empty() {
            return run;
        }
        while run.claimed < freed {
            let Some((addr, holder)) = self.waitlist.pop() else {
                if self.waitlist.overflowed() {
                    self.waitlist.clear_overflow();
                    run.rescan = true;
                }
                break;
            };
            if !still_shown(addr, holder.ifindex) {
                continue;
            }
            match self.claim(addr, holder.clone(), Source::Netlink) {
                Err(RegistryError::Full { .. }) => {
                    self.waitlist.push_front(addr, holder);
                    break;
                }
                Err(e) => log::warn!("{addr}: a waiting claim for {holder} failed: {e}"),
                Ok(effects) => {
                    run.claimed += 1;
                    log::debug!("{addr}: claimed for {holder} now that the registry has room");
                    run.effects.extend(effects);
                }
            }
        }
        run
    }
}

#[cfg(test)]
mod tests;
