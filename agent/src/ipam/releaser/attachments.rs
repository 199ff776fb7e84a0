//! Releases of the same attachment. A runtime that retries a DEL (containerd retries
//! StopPodSandbox until it succeeds, and RemovePodSandbox runs one more) makes ipq-ipam hand
//! the agent one release per DEL, all for the same allocation. The delegate's DEL frees the
//! attachment's allocation whole (host-local frees by container id and ifname), so once one of
//! them succeeded the others have nothing left to do; until then they are one hold.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use ipq_api::model::HeldRelease;
use ipq_fs::spool::Spooled;

/// Which allocation a release gives back: network, container id and ifname.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Attachment {
    network: Option<String>,
    container_id: String,
    ifname: String,
}

impl Attachment {
    pub(super) fn of(release: &HeldRelease) -> Self {
        Self {
            network: release.network.clone(),
            container_id: release.container_id.clone(),
            ifname: release.ifname.clone(),
        }
    }
}

/// Every address the pending releases of each attachment name.
pub(super) fn addresses_by_attachment(
    pending: &[Spooled<HeldRelease>],
) -> HashMap<Attachment, Vec<IpAddr>> {
    let mut all: HashMap<Attachment, BTreeSet<IpAddr>> = HashMap::new();
    for spooled in pending {
        all.entry(Attachment::of(&spooled.request))
            .or_default()
            .extend(spooled.request.addresses.iter().copied());
    }
    all.into_iter()
        .map(|(attachment, addresses)| (attachment, addresses.into_iter().collect()))
        .collect()
}

/// `release` naming every address its attachment's releases name: the hold a failed DEL puts
/// back whole.
pub(super) fn whole(release: &HeldRelease, addresses: &[IpAddr]) -> HeldRelease {
    let mut whole = release.clone();
    whole.addresses = addresses.to_vec();
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(container_id: &str, addresses: &[&str]) -> HeldRelease {
        serde_json::from_value(serde_json::json!({
            "network": "net",
            "cniVersion": "1.0.0",
            "delegateType": "host-local",
            "delegateConf": {},
            "containerId": container_id,
            "ifname": "eth0",
            "cniPath": "/opt/cni/bin",
            "addresses": addresses,
        }))
        .expect("a release as ipq-ipam writes it")
    }

    #[test]
    fn the_releases_of_one_attachment_hold_every_address_any_of_them_names() {
        let first = release("a", &["10.99.0.2"]);
        let retried = release("a", &["10.99.0.2", "fd00::2"]);
        let other = release("b", &["10.99.0.3"]);
        assert_eq!(Attachment::of(&first), Attachment::of(&retried));
        assert_ne!(Attachment::of(&first), Attachment::of(&other));
        let mut all: BTreeSet<IpAddr> = BTreeSet::new();
        for r in [&first, &retried] {
            all.extend(r.addresses.iter().copied());
        }
        let all: Vec<IpAddr> = all.into_iter().collect();
        let whole = whole(&first, &all);
        assert_eq!(whole.addresses, all);
        assert_eq!(whole.container_id, "a");
    }
}
