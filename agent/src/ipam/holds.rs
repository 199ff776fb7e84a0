//! The allocations `ipq-ipam` holds in the node's IPAM, as the releaser last saw them, shared
//! with the owner loop so that `ipq get` and `ipq list` say which addresses the IPAM keeps
//! allocated for ipq and until when. The releaser replaces the whole table after each scan of
//! the pending releases (O(pending), off the loop); the loop only reads one address's entry.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
};

use ipq_api::model::HeldRelease;
use ipq_fs::spool::Spooled;

/// One held allocation's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// Failed delegate DELs so far (retried with backoff), and the last error.
    pub failures: u32,
    pub last_error: Option<String>,
}

/// Shared between the releaser (writer) and the owner loop (reader).
#[derive(Clone, Debug, Default)]
pub struct Holds(Arc<Mutex<BTreeMap<IpAddr, Hold>>>);

impl Holds {
    fn table(&self) -> MutexGuard<'_, BTreeMap<IpAddr, Hold>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The hold of `addr`, if the IPAM keeps it allocated for ipq.
    pub fn get(&self, addr: IpAddr) -> Option<Hold> {
        self.table().get(&addr).cloned()
    }

    /// Every held address (for `ipq list`): O(held).
    pub fn all(&self) -> Vec<(IpAddr, Hold)> {
        self.table().iter().map(|(a, h)| (*a, h.clone())).collect()
    }

    /// A release ran: its addresses are the IPAM's to hand out again.
    pub fn forget(&self, addresses: &[IpAddr]) {
        let mut table = self.table();
        for addr in addresses {
            table.remove(addr);
        }
    }

    /// `held` was just stored: its addresses are held from now, before the releaser's next
    /// scan.
    pub fn hold(&self, held: &HeldRelease) {
        let mut table = self.table();
        for addr in &held.addresses {
            table
                .entry(*addr)
                .or_insert_with(|| Hold::of(held, 0, None));
        }
    }

    /// Puts back the hold of `held`, whose release just failed (forgotten before its DEL ran):
    /// at once, not at the next scan, so that a requested-IP ADD meanwhile is told the address
    /// is held rather than asking the delegate for it.
    pub fn put_back(&self, held: &HeldRelease, failures: u32, last_error: &str) {
        let mut table = self.table();
        for addr in &held.addresses {
            table.insert(*addr, Hold::of(held, failures, Some(last_error.to_owned())));
        }
    }

    /// The table as one scan of the pending releases found it, with each release's failures.
    pub fn replace(
        &self,
        pending: &[Spooled<HeldRelease>],
        failures: &HashMap<PathBuf, (u32, Option<String>)>,
    ) {
        let mut table = BTreeMap::new();
        for spooled in pending {
            let held = &spooled.request;
            let (failures, last_error) = failures.get(&spooled.path).cloned().unwrap_or_default();
            for addr in &held.addresses {
                table.insert(*addr, Hold::of(held, failures, last_error.clone()));
            }
        }
        *self.table() = table;
    }
}

impl Hold {
    fn of(held: &HeldRelease, failures: u32, last_error: Option<String>) -> Self {
        Self {
            network: held.network.clone().unwrap_or_default(),
            container_id: held.container_id.clone(),
            ifname: held.ifname.clone(),
            failures,
            last_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_forgotten_for_a_del_that_failed_is_back_at_once_with_its_failure() {
        let held: HeldRelease = serde_json::from_value(serde_json::json!({
            "network": "net",
            "cniVersion": "1.0.0",
            "delegateType": "host-local",
            "delegateConf": {},
            "containerId": "c1",
            "ifname": "eth0",
            "cniPath": "/opt/cni/bin",
            "addresses": ["10.96.0.2"],
        }))
        .expect("a release as ipq-ipam writes it");
        let addr: IpAddr = "10.96.0.2".parse().unwrap();
        let holds = Holds::default();
        holds.put_back(&held, 0, "");
        holds.forget(&held.addresses);
        assert_eq!(holds.get(addr), None);
        holds.put_back(&held, 2, "exit 1");
        let hold = holds.get(addr).expect("put back");
        assert_eq!((hold.container_id.as_str(), hold.failures), ("c1", 2));
        assert_eq!(hold.last_error.as_deref(), Some("exit 1"));
    }
}
