//! Writing a whole journal file: for a rewrite on the owner loop (at start, after a failure)
//! and for a compaction on a thread of its own.

use std::{
    fs::File,
    io::{self, BufWriter, Write as _},
    path::Path,
    thread::{self, JoinHandle},
    time::Duration,
};

use super::{
    boot_id, files,
    format::{frame, Header, Line, BASE_CHUNK, FORMAT, VERSION},
    invalid_data, unix_ms, Entry,
};
use crate::netdev;

/// Bytes a compaction writes before it pushes them to the disk: never lets tens of megabytes of
/// dirty pages pile up, which every commit's fdatasync (the same filesystem journal, in ext4's
/// ordered mode) would otherwise have to wait for.
const WRITEBACK_BYTES: u64 = 1 << 20;

/// Writes `len` bytes at `offset` of `file` back to the disk and waits for them, without a
/// journal commit (the final fsync makes the file durable).
fn write_back(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: sync_file_range on an open descriptor, with plain integer arguments.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, flags) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Creates `path` (exclusively) holding a header and `records`, fsynced; returns it open for
/// appending, with its length.
pub fn write_base<E: Entry>(path: &Path, records: &[E]) -> io::Result<(File, u64)> {
    let file = files::create_new(path)?;
    write_into(file, records)
}

fn write_into<E: Entry>(file: File, records: &[E]) -> io::Result<(File, u64)> {
    let mut out = BufWriter::with_capacity(WRITEBACK_BYTES as usize, file);
    let mut len = 0u64;
    let mut flushed = 0u64;
    let mut line = Vec::new();
    let mut put = |json: &[u8], out: &mut BufWriter<File>| -> io::Result<()> {
        line.clear();
        frame(json, &mut line);
        len += line.len() as u64;
        out.write_all(&line)?;
        if len - flushed >= WRITEBACK_BYTES {
            out.flush()?;
            write_back(out.get_ref(), flushed, len - flushed)?;
            flushed = len;
        }
        Ok(())
    };
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        boot_id: boot_id(),
        written_mono_ns: netdev::monotonic_ns(),
        written_unix_ms: unix_ms(),
        body_len: None,
        body_fnv64: None,
    };
    put(
        &serde_json::to_vec(&header).map_err(invalid_data)?,
        &mut out,
    )?;
    for chunk in records.chunks(BASE_CHUNK) {
        let json = serde_json::to_vec(&Line::<&E, E::Key> {
            m: None,
            u: None,
            put: chunk.iter().collect(),
            del: Vec::new(),
        })
        .map_err(invalid_data)?;
        put(&json, &mut out)?;
    }
    let file = out.into_inner().map_err(io::IntoInnerError::into_error)?;
    file.sync_all()?;
    Ok((file, len))
}

/// A compaction running on its own thread, and the batch lines committed since it started (to
/// be appended to its file before it replaces the journal).
pub struct Compaction {
    handle: JoinHandle<io::Result<(File, u64)>>,
    pub pending: Vec<Vec<u8>>,
}

impl Compaction {
    /// Starts writing `records` to `path` (created here, exclusively, so that a failure to
    /// create it is reported at once).
    pub fn start<E: Entry>(path: std::path::PathBuf, records: Vec<E>) -> io::Result<Self> {
        files::remove_leftover(&path)?;
        let file = files::create_new(&path)?;
        let handle = thread::Builder::new()
            .name("ipq-compact".into())
            .spawn(move || write_into(file, &records))?;
        Ok(Self {
            handle,
            pending: Vec::new(),
        })
    }

    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    pub fn wait(&self) {
        while !self.handle.is_finished() {
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its file and the length of its base.
    pub fn join(self) -> io::Result<(File, u64)> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the compaction thread panicked")))
    }

    /// Drops it: its file is removed, the thread finishes writing into the unlinked inode.
    pub fn abandon(self, path: &Path) {
        let _ = files::remove_leftover(path);
    }
}
