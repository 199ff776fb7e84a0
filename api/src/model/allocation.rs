//! The record of one allocation ipq-ipam's ADD made through its delegate: exactly what a later
//! release of it will run (issue 27). A release names a record by network, container id and
//! ifname, and what runs is the record, never the release's body.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{HeldRelease, InvalidRelease};

/// One allocation, as the delegate's ADD made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationRecord {
    pub network: Option<String>,
    pub cni_version: String,
    pub delegate_type: String,
    /// The delegate's stdin as ADD ran it (the network config, `ipam` the delegate's).
    pub delegate_conf: Value,
    pub container_id: String,
    pub ifname: String,
    pub cni_args: Option<String>,
    pub cni_path: String,
    pub netns: Option<String>,
    /// From the delegate's result.
    pub addresses: Vec<IpAddr>,
}

impl AllocationRecord {
    /// The release that completes this allocation, handed over at `held_at_unix_ms`.
    pub fn release_at(&self, held_at_unix_ms: u64) -> HeldRelease {
        HeldRelease {
            network: self.network.clone(),
            cni_version: self.cni_version.clone(),
            delegate_type: self.delegate_type.clone(),
            delegate_conf: self.delegate_conf.clone(),
            container_id: self.container_id.clone(),
            ifname: self.ifname.clone(),
            cni_args: self.cni_args.clone(),
            cni_path: self.cni_path.clone(),
            netns: self.netns.clone(),
            addresses: self.addresses.clone(),
            held_at_unix_ms,
            held_at_boot: None,
        }
    }

    /// What a release checks, named the same way (a 400 naming the field).
    pub fn validate(&self) -> Result<(), InvalidRelease> {
        self.release_at(0).validate()
    }

    /// The record's file name under `state_dir/ipam-allocations`.
    pub fn file_name(&self) -> String {
        file_name(self.network.as_deref(), &self.container_id, &self.ifname)
    }
}

/// The file name of the record of (network, container id, ifname): `alloc-<FNV-1a 64>.json`,
/// stable across builds (ipq-ipam and the agent may be of different releases) and bounded in
/// length whatever the names. The file holds the three, so a collision is seen, not trusted.
pub fn file_name(network: Option<&str>, container_id: &str, ifname: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let parts = [network.unwrap_or_default(), container_id, ifname];
    for (i, part) in parts.iter().enumerate() {
        // A separator that no name holds, so ("a", "bc") and ("ab", "c") differ.
        let bytes = part
            .bytes()
            .chain(std::iter::once(if i < 2 { b'\0' } else { b'\n' }));
        for byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("alloc-{hash:016x}.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_stable_and_tell_attachments_apart() {
        let a = file_name(Some("net"), "c1", "eth0");
        assert_eq!(a, file_name(Some("net"), "c1", "eth0"));
        assert_eq!(a.len(), "alloc-.json".len() + 16);
        assert_ne!(a, file_name(Some("net"), "c1", "eth1"));
        assert_ne!(a, file_name(Some("ne"), "tc1", "eth0"));
        assert_ne!(a, file_name(None, "c1", "eth0"));
        // Pinned (FNV-1a 64 of `n NUL c NUL e LF`, checked by hand): a new build must find the
        // files an older one wrote.
        assert_eq!(
            file_name(Some("n"), "c", "e"),
            "alloc-b3130f90cbff8dcf.json"
        );
    }
}
