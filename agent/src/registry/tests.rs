//! Every transition of DESIGN §2, and every illegal one, with the fake clock. Each operation
//! goes through [`Harness`], which also checks after every step that the datapath mirror built
//! from the emitted effects equals the registry's own view, and that its indexes are sound.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv6Addr},
    time::Duration,
};

use ipq_common::addr::{AddrEntry, AddrState, NO_IFINDEX};

use super::*;
use crate::config::{Config, EarlyReusePolicy};

mod batch;
mod durability;
mod footprint;
mod lifecycle;
mod policies;
mod remote_claim;

const START: MonoNs = 1_000_000_000_000;
const SEC: u64 = 1_000_000_000;

fn settings(policy: EarlyReusePolicy) -> RegistrySettings {
    RegistrySettings {
        policy,
        cooldown: Duration::from_secs(30),
        quiet_period: Duration::from_secs(10),
        max_cooldown: Duration::from_secs(300),
        capacity: 8,
    }
}

fn h(ifindex: u32) -> Holder {
    Holder::new(ifindex, format!("veth{ifindex}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Harness {
    reg: Registry<FakeClock>,
    clock: FakeClock,
    mirror: BTreeMap<IpAddr, AddrEntry>,
}

impl Harness {
    fn new(policy: EarlyReusePolicy) -> Self {
        Self::with(settings(policy))
    }

    fn with(settings: RegistrySettings) -> Self {
        let clock = FakeClock::new(START);
        Self {
            reg: Registry::new(settings, clock.clone()),
            clock,
            mirror: BTreeMap::new(),
        }
    }

    fn now(&self) -> MonoNs {
        self.clock.now()
    }

    fn advance(&self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    /// Runs one operation, applies its effects to the mirror and checks the invariants.
    fn run(
        &mut self,
        op: impl FnOnce(&mut Registry<FakeClock>) -> Result<Vec<Effect>, RegistryError>,
    ) -> Result<Vec<Effect>, RegistryError> {
        let before = self.reg.lifecycle().snapshot();
        let result = op(&mut self.reg);
        match &result {
            Ok(effects) => apply_to_mirror(&mut self.mirror, effects),
            Err(_) => assert_eq!(
                self.reg.lifecycle().snapshot(),
                before,
                "an error changed the registry"
            ),
        }
        assert_eq!(
            self.mirror,
            self.reg.records().datapath_entries(),
            "mirror diverged"
        );
        self.reg.records().check_invariants().unwrap();
        result
    }

    fn ok(
        &mut self,
        op: impl FnOnce(&mut Registry<FakeClock>) -> Result<Vec<Effect>, RegistryError>,
    ) -> Vec<Effect> {
        self.run(op).expect("operation failed")
    }

    fn claim(&mut self, addr: &str, holder: Holder, source: Source) -> Vec<Effect> {
        let addr = ip(addr);
        self.ok(|r| r.claim(addr, holder, source))
    }

    fn record(&self, addr: &str) -> AddrRecord {
        self.reg
            .records()
            .get(ip(addr))
            .cloned()
            .expect("no record")
    }

    fn entry(&self, addr: &str) -> AddrEntry {
        self.reg.records().datapath_entries()[&ip(addr)]
    }
}

fn conflicts(effects: &[Effect]) -> Vec<&Conflict> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Conflict(c) => Some(&**c),
            _ => None,
        })
        .collect()
}

fn transitions(effects: &[Effect]) -> Vec<(StateName, StateName)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Transition { from, to, .. } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

fn released(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Released {
                quarantined_for_ns, ..
            } => Some(*quarantined_for_ns),
            _ => None,
        })
        .collect()
}
