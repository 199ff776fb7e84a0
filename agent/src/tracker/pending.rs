//! Holders the registry refused because it was full: their addresses are seen but not
//! protected. They wait here, oldest first, and are claimed again as space frees — one per
//! freed record, so no event ever scans the registry or the node's routes.
//!
//! The queue is bounded. Past its bound the newest are not queued but counted, and the next
//! time the queue runs dry while space frees, the owner rescans the node's routes once.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::IpAddr,
};

use crate::registry::Holder;

/// Claimants kept at most; ~100 bytes each.
pub const MAX_PENDING: usize = 65_536;

#[derive(Debug)]
pub struct PendingClaims {
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

impl Default for PendingClaims {
    fn default() -> Self {
        Self::with_bound(MAX_PENDING)
    }
}

impl PendingClaims {
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
    pub fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.overflowed == 0
    }

    /// Whether the bound left claimants out (the owner rescans once the queue is empty).
    pub fn overflowed(&self) -> bool {
        self.overflowed > 0
    }

    /// Forgets the overflow count: the owner is rescanning.
    pub fn clear_overflow(&mut self) {
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
    pub fn push_front(&mut self, addr: IpAddr, holder: Holder) {
        let key = (addr, holder.ifindex);
        if self.holders.insert(key, holder).is_none() {
            self.index(key);
            self.order.push_front(key);
        }
    }

    /// The oldest claimant still waiting.
    pub fn pop(&mut self) -> Option<(IpAddr, Holder)> {
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
    fn check_index(&self) -> Result<(), String> {
        let mut rebuilt: HashMap<u32, HashSet<IpAddr>> = HashMap::new();
        for (addr, ifindex) in self.holders.keys() {
            rebuilt.entry(*ifindex).or_default().insert(*addr);
        }
        if rebuilt != self.of_interface {
            return Err(format!("{:?} != {rebuilt:?}", self.of_interface));
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn claimants_come_back_oldest_first_and_forgotten_ones_never() {
        let mut pending = PendingClaims::default();
        assert!(pending.push(ip("10.0.0.1"), Holder::new(3, "veth3")));
        assert!(pending.push(ip("10.0.0.2"), Holder::new(4, "veth4")));
        assert!(pending.push(ip("10.0.0.3"), Holder::new(5, "veth5")));
        assert!(!pending.push(ip("10.0.0.1"), Holder::new(3, "veth3")));
        assert_eq!(pending.len(), 3);
        pending.forget(ip("10.0.0.2"), 4);
        assert_eq!(pending.len(), 2);
        assert_eq!(pending.pop().map(|(a, _)| a), Some(ip("10.0.0.1")));
        pending.forget_interface(5);
        assert_eq!(pending.pop(), None);
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn past_the_bound_claimants_are_counted_not_kept() {
        let mut pending = PendingClaims::with_bound(1);
        pending.push(ip("10.0.0.1"), Holder::new(3, "veth3"));
        pending.push(ip("10.0.0.2"), Holder::new(4, "veth4"));
        assert_eq!(pending.len(), 2);
        assert!(pending.overflowed());
        assert_eq!(pending.pop().map(|(a, _)| a), Some(ip("10.0.0.1")));
        assert_eq!(pending.pop(), None);
        pending.clear_overflow();
        assert_eq!(pending.len(), 0);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u8, u32),
        PushFront(u8, u32),
        Pop,
        Forget(u8, u32),
        ForgetInterface(u32),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0..4u8, 1..4u32).prop_map(|(a, i)| Op::Push(a, i)),
            (0..4u8, 1..4u32).prop_map(|(a, i)| Op::PushFront(a, i)),
            Just(Op::Pop),
            (0..4u8, 1..4u32).prop_map(|(a, i)| Op::Forget(a, i)),
            (1..4u32).prop_map(Op::ForgetInterface),
        ]
    }

    proptest::proptest! {
        /// The interface index lists exactly the waiting claimants, whatever came and went, and
        /// an interface forgotten never comes back out of the queue.
        #[test]
        fn the_interface_index_follows_every_operation(
            ops in proptest::collection::vec(op(), 0..60)
        ) {
            let mut pending = PendingClaims::with_bound(6);
            let addr = |a: u8| IpAddr::from([10, 0, 0, a]);
            for op in ops {
                match op {
                    Op::Push(a, i) => {
                        pending.push(addr(a), Holder::new(i, format!("veth{i}")));
                    }
                    Op::PushFront(a, i) => {
                        pending.push_front(addr(a), Holder::new(i, format!("veth{i}")));
                    }
                    Op::Pop => {
                        pending.pop();
                    }
                    Op::Forget(a, i) => pending.forget(addr(a), i),
                    Op::ForgetInterface(i) => {
                        pending.forget_interface(i);
                        proptest::prop_assert!(pending.holders.keys().all(|(_, j)| *j != i));
                    }
                }
                if let Err(problem) = pending.check_index() {
                    return Err(proptest::test_runner::TestCaseError::fail(problem));
                }
            }
        }
    }
}
