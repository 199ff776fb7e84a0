//! DELs that arrived while the agent was down, kept on disk until the agent replays them.
//!
//! Contract (the agent calls this at start, after recovering the registry and before the
//! netlink reconcile):
//!
//! ```ignore
//! for spooled in ipq::cni::spool::pending(&ipq::paths::cni_spool_dir(&config.state_dir))? {
//!     // apply spooled.request (a DrainAttachmentRequest) through the registry, then:
//!     spooled.done()?; // removes the file
//! }
//! ```

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::api::model::DrainAttachmentRequest;

#[derive(Debug, Error)]
pub enum SpoolError {
    #[error("spool {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// One spooled DEL.
#[derive(Debug)]
pub struct SpooledDel {
    pub path: PathBuf,
    pub request: DrainAttachmentRequest,
}

impl SpooledDel {
    /// Removes the spooled file once its DEL has been applied.
    pub fn done(self) -> Result<(), SpoolError> {
        std::fs::remove_file(&self.path).map_err(|source| SpoolError::Io {
            path: self.path,
            source,
        })
    }
}

/// The DELs waiting in `dir`, oldest first. (Placeholder until the CNI work lands.)
pub fn pending(dir: &Path) -> Result<Vec<SpooledDel>, SpoolError> {
    let _ = dir;
    Ok(Vec::new())
}
