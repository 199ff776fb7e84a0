//! The records of ipq-ipam's allocations on disk, one file per attachment under
//! `state_dir/ipam-allocations` (named by [`file_name`]), written atomically and fsynced: by
//! the agent when it records one, by ipq-ipam itself while the agent is away (the agent adopts
//! those at its next scan).

use std::{
    fs,
    path::{Path, PathBuf},
};

use ipq_api::model::{file_name, AllocationRecord};

use crate::{
    safe_fs,
    spool::{self, SpoolError},
};

/// Writes `record` (replacing the attachment's earlier one) and returns its path.
pub fn write(dir: &Path, record: &AllocationRecord) -> Result<PathBuf, SpoolError> {
    let path = dir.join(record.file_name());
    spool::write_at(&path, record)?;
    Ok(path)
}

/// Removes the record of (network, container id, ifname), if there is one.
pub fn remove(
    dir: &Path,
    network: Option<&str>,
    container_id: &str,
    ifname: &str,
) -> std::io::Result<()> {
    match fs::remove_file(dir.join(file_name(network, container_id, ifname))) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The records in `dir` whose file name is not in `known`, by file name. A file that is not a
/// record, or whose name is not its attachment's, is skipped with a warning (never trusted).
pub fn read_new(
    dir: &Path,
    known: &dyn Fn(&str) -> bool,
) -> std::io::Result<Vec<(String, AllocationRecord)>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let Ok(name) = entry?.file_name().into_string() else {
            continue;
        };
        if !name.starts_with("alloc-") || !name.ends_with(".json") || known(&name) {
            continue;
        }
        if let Some(record) = read_one(dir, &name) {
            out.push((name, record));
        }
    }
    Ok(out)
}

/// The record in `dir` named `name`, if there is a valid one: None when there is no such file,
/// and None with a warning when the file is not the valid record its name says (never trusted).
pub fn read_one(dir: &Path, name: &str) -> Option<AllocationRecord> {
    let path = dir.join(name);
    let bytes = match safe_fs::read_regular(&path) {
        Ok(bytes) => bytes,
        Err(safe_fs::OpenError::Missing) => return None,
        Err(e) => {
            log::warn!("ipam allocations: {}: {e}; skipped", path.display());
            return None;
        }
    };
    match serde_json::from_slice::<AllocationRecord>(&bytes) {
        Ok(record) if record.file_name() == name && record.validate().is_ok() => Some(record),
        Ok(_) => {
            log::warn!(
                "ipam allocations: {} is not the valid record its name says; skipped",
                path.display()
            );
            None
        }
        Err(e) => {
            log::warn!("ipam allocations: {}: {e}; skipped", path.display());
            None
        }
    }
}
