//! Which delegate binaries the agent runs. A held release comes from the API (root peers only:
//! `POST /v1/ipam/releases` needs the root role, uid 0 with `CAP_NET_ADMIN`, whatever
//! `api_group` and `api_admin_group` say) or from the spool (root's directory), and the agent
//! runs its delegate's DEL as root: were `cniPath` and `delegateType` taken as given, whoever
//! can hand the agent a release could run any binary as root. So the agent only runs a plugin
//! by its bare name (`is_plugin_name`), found in the CNI bin directories the operator
//! configured (`ipam_cni_bin_dirs`) that the release's `cniPath` also names, and only a
//! regular file that neither group nor others can write, that root (or the agent's own user)
//! owns, in directories (up to `/`) that nobody else may write either (a sticky one, as
//! `/tmp`, lets nobody replace another's file).
//!
//! Directories are compared as written, component by component (`/opt/cni/bin/` is
//! `/opt/cni/bin`, `/opt/cni/bin/../x` is not): no symlink or `..` is resolved, so a release
//! cannot name its way into a trusted directory. The binary is then opened once, every
//! directory up to `/` and the file checked on the descriptors the walk holds, and that
//! descriptor is what runs ([`resolve`]): nothing can be swapped between the check and the
//! exec. A symlink inside a trusted directory (a node's plugin dir linking a distribution's
//! plugins) is followed by that walk, and its target checked.

use std::path::PathBuf;

use ipq_api::model::{is_plugin_name, HeldRelease};

pub use self::resolve::{Opened, ResolveError};

pub mod resolve;

/// Why a release's delegate will not run.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "delegateType {0:?} is not a plugin's file name; the agent only runs a plugin by name"
    )]
    NotAPluginName(String),
    #[error(
        "cniPath {cni_path:?} names no CNI bin directory the agent trusts ({trusted}); add the \
         plugin directory to ipam_cni_bin_dirs"
    )]
    NoTrustedDir { cni_path: String, trusted: String },
    #[error("plugin {kind:?} is in none of the trusted directories of cniPath ({dirs})")]
    NotFound { kind: String, dirs: String },
    #[error("{0}; the agent runs no delegate it cannot trust")]
    Unsafe(#[source] ResolveError),
}

/// The CNI bin directories the agent runs delegates from (`ipam_cni_bin_dirs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedBins {
    dirs: Vec<PathBuf>,
}

impl TrustedBins {
    pub fn new(dirs: Vec<PathBuf>) -> TrustedBins {
        TrustedBins { dirs }
    }

    fn listed(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `release`'s `cniPath` directories that the agent trusts, in `cniPath`'s order (a
    /// runtime's lookup order); at least one, or the error naming `cniPath`. No file system
    /// access: the API checks this at `POST /v1/ipam/releases`.
    pub fn dirs_of(&self, release: &HeldRelease) -> Result<Vec<PathBuf>, TrustError> {
        let dirs: Vec<PathBuf> = release
            .cni_path_dirs()
            .filter(|dir| self.dirs.iter().any(|trusted| trusted == dir))
            .collect();
        if dirs.is_empty() {
            return Err(TrustError::NoTrustedDir {
                cni_path: release.cni_path.clone(),
                trusted: self.listed(),
            });
        }
        Ok(dirs)
    }

    /// What [`dirs_of`](Self::dirs_of) checks, and that the delegate's type is a plugin name.
    pub fn check(&self, release: &HeldRelease) -> Result<(), TrustError> {
        if !is_plugin_name(&release.delegate_type) {
            return Err(TrustError::NotAPluginName(release.delegate_type.clone()));
        }
        self.dirs_of(release).map(|_| ())
    }

    /// The delegate binary of `release`, opened: in its first trusted `cniPath` directory that
    /// has a file of that name (as libcni's `FindInPath`), and safe to run as root. What runs
    /// is the descriptor returned, never the path looked up again ([`resolve`]).
    pub fn open(&self, release: &HeldRelease) -> Result<Opened, TrustError> {
        self.check(release)?;
        let dirs = self.dirs_of(release)?;
        let kind = &release.delegate_type;
        for dir in &dirs {
            match resolve::open_trusted(&dir.join(kind)) {
                Ok(opened) => return Ok(opened),
                Err(ResolveError::Missing { .. }) => continue,
                Err(e) => return Err(TrustError::Unsafe(e)),
            }
        }
        Err(TrustError::NotFound {
            kind: kind.clone(),
            dirs: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

#[cfg(test)]
mod tests;
