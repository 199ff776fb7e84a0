//! The records of ipq-ipam's allocations (issue 27): what each ADD's delegate allocated, and so
//! exactly what a later release of it runs. Kept in memory and durably under
//! `state_dir/ipam-allocations` (one file per attachment, written atomically and fsynced);
//! files ipq-ipam wrote while the agent was away are adopted at start and at each releaser
//! scan. Bounded in number: a full table refuses a new record (ipq-ipam's ADD fails with code
//! 11), never evicts one.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, SystemTime},
};

use ipq_api::model::{file_name, AllocationRecord};
use ipq_fs::{records, spool::SpoolError};

/// Why a record was not kept.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error(
        "{capacity} allocation records are kept already (the registry's capacity); none is \
         evicted: try again once releases have completed"
    )]
    Full { capacity: usize },
    #[error("storing the allocation record: {0}")]
    Store(#[from] SpoolError),
}

/// Shared between the owner loop (records, looks up) and the releaser (adopts, forgets).
#[derive(Clone, Debug)]
pub struct Records {
    table: Arc<Mutex<HashMap<String, AllocationRecord>>>,
    dir: PathBuf,
    capacity: usize,
    /// The directory's modification time at the last listing that can be trusted to have seen
    /// every file of that time (see [`Records::adopt`]).
    listed_at: Arc<Mutex<Option<SystemTime>>>,
}

/// How old a directory's modification time must be before a listing is known to have seen
/// every entry made at that time: file times come from a coarse clock (a jiffy), so an entry
/// made just after a listing may share the time the listing saw.
const SETTLED: Duration = Duration::from_secs(1);

impl Records {
    pub fn new(dir: PathBuf, capacity: usize) -> Self {
        Self {
            table: Arc::default(),
            dir,
            capacity,
            listed_at: Arc::default(),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<String, AllocationRecord>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps `record` (replacing the attachment's earlier one, as a repeated ADD does), on
    /// disk first. One file write and fsync.
    pub fn insert(&self, record: AllocationRecord) -> Result<(), RecordError> {
        let name = record.file_name();
        // Checked before the write, the table unlocked through it: the owner loop looks
        // records up under this lock, and a write waits for the disk. Two ADDs racing for the
        // last places may pass the bound by the number of writes in flight (API workers).
        {
            let table = self.table();
            if !table.contains_key(&name) && table.len() >= self.capacity {
                return Err(RecordError::Full {
                    capacity: self.capacity,
                });
            }
        }
        records::write(&self.dir, &record)?;
        self.table().insert(name, record);
        Ok(())
    }

    /// The record of (network, container id, ifname), if there is one: from memory, else from
    /// its own file (one small read: the file is named after the attachment), which is then
    /// kept. So a restarted agent needs no listing of every record before it answers a DEL.
    pub fn get(
        &self,
        network: Option<&str>,
        container_id: &str,
        ifname: &str,
    ) -> Option<AllocationRecord> {
        let name = file_name(network, container_id, ifname);
        let known = self.table().get(&name).cloned();
        let record = match known {
            Some(record) => record,
            None => {
                let record = records::read_one(&self.dir, &name)?;
                self.table().insert(name, record.clone());
                record
            }
        };
        (record.network.as_deref() == network
            && record.container_id == container_id
            && record.ifname == ifname)
            .then_some(record)
    }

    /// The allocation was released: its record goes, file and all.
    pub fn forget(&self, network: Option<&str>, container_id: &str, ifname: &str) {
        self.table()
            .remove(&file_name(network, container_id, ifname));
        if let Err(e) = records::remove(&self.dir, network, container_id, ifname) {
            log::error!("ipam allocations: removing a released allocation's record: {e}");
        }
    }

    /// Takes in the record files not yet known (ipq-ipam's, written while the agent was
    /// away): how many. Blocking file reads: call off the async threads.
    /// The directory is listed only when its modification time moved since the last listing
    /// (a file added or removed), so an idle node with 64k records lists nothing.
    pub fn adopt(&self) -> usize {
        let modified = std::fs::metadata(&self.dir).and_then(|m| m.modified()).ok();
        {
            let listed_at = self
                .listed_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if modified.is_some() && *listed_at == modified {
                return 0;
            }
        }
        let settled = modified.filter(|m| {
            SystemTime::now()
                .duration_since(*m)
                .is_ok_and(|age| age >= SETTLED)
        });
        let adopted = self.list_new();
        *self
            .listed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = settled;
        adopted
    }

    fn list_new(&self) -> usize {
        let known: std::collections::HashSet<String> = self.table().keys().cloned().collect();
        let is_known = |name: &str| known.contains(name);
        match records::read_new(&self.dir, &is_known) {
            Ok(new) => {
                let n = new.len();
                let mut table = self.table();
                // Already on disk: kept even past capacity (refusing now would lose nothing but
                // the record, and with it what the release must run).
                table.extend(new);
                n
            }
            Err(e) => {
                log::error!("ipam allocations: reading {}: {e}", self.dir.display());
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(container_id: &str) -> AllocationRecord {
        serde_json::from_value(serde_json::json!({
            "network": "net",
            "cniVersion": "1.0.0",
            "delegateType": "host-local",
            "delegateConf": {"type": "bridge", "ipam": {"type": "host-local"}},
            "containerId": container_id,
            "ifname": "eth0",
            "cniPath": "/opt/cni/bin",
            "addresses": ["10.1.0.2"],
        }))
        .expect("a record as ipq-ipam writes it")
    }

    #[test]
    fn records_are_bounded_durable_adopted_and_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/ipam-allocations");
        let records = Records::new(dir.clone(), 2);
        records.insert(record("a")).unwrap();
        records.insert(record("b")).unwrap();
        // Replacing one's own is no new record; a third is refused.
        records.insert(record("a")).unwrap();
        let err = records.insert(record("c")).unwrap_err();
        assert!(matches!(err, RecordError::Full { capacity: 2 }), "{err}");
        assert_eq!(
            records
                .get(Some("net"), "a", "eth0")
                .map(|r| r.container_id),
            Some("a".into())
        );
        assert!(records.get(Some("net"), "a", "eth1").is_none());

        // Another agent (after a restart) finds them on disk; ipq-ipam's own is adopted.
        let restarted = Records::new(dir.clone(), 2);
        records::write(&dir, &record("away")).unwrap();
        // Looked up by its file, before any listing (a restarted agent answers a DEL at once).
        assert!(restarted.get(Some("net"), "away", "eth0").is_some());
        assert!(restarted.get(Some("net"), "never", "eth0").is_none());
        assert_eq!(restarted.adopt(), 2, "the two the agent wrote");
        assert_eq!(restarted.adopt(), 0, "adopted once");
        assert!(restarted.get(Some("net"), "away", "eth0").is_some());
        restarted.forget(Some("net"), "away", "eth0");
        assert!(restarted.get(Some("net"), "away", "eth0").is_none());
        assert!(!dir.join(file_name(Some("net"), "away", "eth0")).exists());
    }

    /// Sets `dir`'s modification time to `secs` after the epoch.
    fn set_mtime(dir: &Path, secs: i64) {
        use std::os::unix::ffi::OsStrExt as _;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let times = [
            libc::timespec {
                tv_sec: secs,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: secs,
                tv_nsec: 0,
            },
        ];
        // SAFETY: a valid C string and two timespecs.
        let rc = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }

    /// An idle directory is not listed again; one whose time moved is.
    #[test]
    fn adoption_lists_the_directory_only_when_it_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ipam-allocations");
        records::write(&dir, &record("first")).unwrap();
        let records = Records::new(dir.clone(), 8);
        set_mtime(&dir, 1_000_000);
        assert_eq!(records.adopt(), 1);
        // A file appears, the directory's time put back as the listing saw it: not listed.
        records::write(&dir, &record("second")).unwrap();
        set_mtime(&dir, 1_000_000);
        assert_eq!(records.adopt(), 0, "an unchanged directory is not listed");
        // Its time moves, as any new entry makes it: listed, the file adopted.
        set_mtime(&dir, 1_000_001);
        assert_eq!(records.adopt(), 1);
        assert!(records.get(Some("net"), "second", "eth0").is_some());
    }
}
