//! Where the plugins write under the agent's `state_dir`: the agent reads the same
//! directories, so both take the paths from here.

use std::path::{Path, PathBuf};

/// Where `ipq-cni` spools the DELs it could not deliver, under the agent's `state_dir`.
pub fn cni_spool_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cni-spool")
}

/// Where `ipq-ipam` spools the releases it hands to the agent while the agent is away, under
/// the agent's `state_dir`.
pub fn ipam_release_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("ipam-releases")
}

/// Where the records of ipq-ipam's allocations live (one file per attachment), written by the
/// agent, or by ipq-ipam itself while the agent is away.
pub fn ipam_allocation_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("ipam-allocations")
}
