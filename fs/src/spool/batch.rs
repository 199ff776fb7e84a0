//! Many spool files written durably in one pass: what a burst of held releases costs the
//! file system. Written one by one, each file is an fsync of itself and one of its directory,
//! two commits of the file system's journal each, which every other fsync on that file system
//! (the agent's own journal, a claim waiting for it) queues behind. Here the files are written,
//! then fsynced concurrently (concurrent fsyncs share the file system's commits), renamed into
//! place, and each directory fsynced once: a few commits for the whole batch.

use std::{fs, io::Write as _, path::Path};

use serde::Serialize;

use super::{io, temp_path, SpoolError};
use crate::safe_fs;

/// Files fsynced at once, at most: each by a thread of its own for the length of the fsync.
const CONCURRENT_SYNCS: usize = 16;

/// One file of the batch, as far as it got.
struct Pending<'a> {
    path: &'a Path,
    temp: std::path::PathBuf,
    file: Option<fs::File>,
    result: Result<(), SpoolError>,
}

/// Writes each `(path, request)` as [`super::write_at`] does (a hidden temp file, fsynced,
/// renamed into place, the directory fsynced), in one pass. One result per request, in order:
/// `Ok` only once that file and its directory entry are durable.
pub fn write_all_at<T: Serialize>(requests: &[(&Path, &T)]) -> Vec<Result<(), SpoolError>> {
    let mut pending: Vec<Pending<'_>> = requests
        .iter()
        .map(|&(path, request)| create(path, request))
        .collect();
    // Concurrent fsyncs: the file system commits them together.
    for chunk in pending.chunks_mut(CONCURRENT_SYNCS) {
        std::thread::scope(|s| {
            for p in chunk.iter_mut().filter(|p| p.file.is_some()) {
                s.spawn(move || {
                    if let Some(Err(source)) = p.file.as_ref().map(fs::File::sync_all) {
                        p.result = Err(SpoolError::Io {
                            path: p.temp.clone(),
                            source,
                        });
                    }
                });
            }
        });
    }
    let mut dirs: Vec<&Path> = Vec::new();
    for p in &mut pending {
        p.file = None;
        if p.result.is_err() {
            let _ = fs::remove_file(&p.temp);
            continue;
        }
        if let Err(source) = fs::rename(&p.temp, p.path) {
            let _ = fs::remove_file(&p.temp);
            p.result = Err(io(p.path)(source));
            continue;
        }
        if let Some(dir) = p.path.parent() {
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    // The renames are durable once their directories are: one fsync per directory.
    for dir in dirs {
        if let Err(e) = fs::File::open(dir).and_then(|d| d.sync_all()) {
            let reason = e.to_string();
            for p in pending
                .iter_mut()
                .filter(|p| p.result.is_ok() && p.path.parent() == Some(dir))
            {
                p.result = Err(io(dir)(std::io::Error::new(e.kind(), reason.clone())));
            }
        }
    }
    pending.into_iter().map(|p| p.result).collect()
}

/// `request`'s temp file beside `path`, written but not yet fsynced.
fn create<'a, T: Serialize>(path: &'a Path, request: &T) -> Pending<'a> {
    let mut pending = Pending {
        path,
        temp: path.to_owned(),
        file: None,
        result: Ok(()),
    };
    let made = (|| -> Result<fs::File, SpoolError> {
        let temp = temp_path(path)?;
        pending.temp.clone_from(&temp);
        if let Some(dir) = path.parent() {
            if let Some(state_dir) = dir.parent() {
                safe_fs::ensure_private_dir(state_dir)?;
            }
            safe_fs::ensure_private_dir(dir)?;
        }
        let body = serde_json::to_vec(request).map_err(SpoolError::Encode)?;
        let mut file = safe_fs::create_excl_nofollow(&temp, 0o600).map_err(io(&temp))?;
        if let Err(source) = file.write_all(&body) {
            let _ = fs::remove_file(&temp);
            return Err(SpoolError::Io { path: temp, source });
        }
        Ok(file)
    })();
    match made {
        Ok(file) => pending.file = Some(file),
        Err(e) => pending.result = Err(e),
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_written_whole_and_a_bad_path_fails_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/spool");
        let (a, b) = (dir.join("del-1.json"), dir.join("del-2.json"));
        let blocked = tmp.path().join("file");
        fs::write(&blocked, b"").unwrap();
        let bad = blocked.join("spool/del-3.json");
        let results = write_all_at(&[
            (a.as_path(), &1u32),
            (bad.as_path(), &3u32),
            (b.as_path(), &2u32),
        ]);
        assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
        assert!(results[1].is_err(), "under a file: {results:?}");
        assert_eq!(fs::read_to_string(&a).unwrap(), "1");
        assert_eq!(fs::read_to_string(&b).unwrap(), "2");
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "no temp file left: {names:?}");
    }
}
