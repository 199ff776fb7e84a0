//! The cgroup parent a [`super::Podman`]'s containers (and their conmon) get, in every
//! hierarchy: `/ipq-podman-<pid>-<n>`, its processes killed and its tree removed at the end.

use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::netns::unique;

pub(super) struct Cgroups {
    /// `--cgroup-parent`: `/ipq-podman-<pid>-<n>`.
    parent: String,
}

impl Cgroups {
    pub(super) fn new() -> Self {
        Self {
            parent: format!("/{}", unique("ipq-podman")),
        }
    }

    /// The parent, as `podman run --cgroup-parent` takes it.
    pub(super) fn parent(&self) -> &str {
        &self.parent
    }

    /// Kills every process left below the parent and removes its trees, retrying for up to 5 s
    /// while a dying process keeps a directory busy; what could not be removed.
    pub(super) fn kill_and_remove(&self) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let dirs = self.dirs();
            let mut pids = Vec::new();
            for dir in &dirs {
                pids_below(dir, &mut pids);
            }
            for pid in &pids {
                // SAFETY: kill has no memory preconditions; these are the test's own processes.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            let failed: Vec<String> = dirs
                .iter()
                .filter_map(|dir| {
                    remove_tree(dir)
                        .err()
                        .map(|e| format!("{}: {e}", dir.display()))
                })
                .collect();
            if failed.is_empty() {
                return None;
            }
            if Instant::now() > deadline {
                return Some(format!("removing cgroups: {}", failed.join(", ")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every cgroup directory of the parent.
    fn dirs(&self) -> Vec<PathBuf> {
        let relative = self.parent.trim_start_matches('/');
        let root = Path::new("/sys/fs/cgroup");
        // cgroup v2 (the root itself) and every v1 hierarchy mounted below it.
        let mut bases = vec![root.to_path_buf()];
        if let Ok(entries) = fs::read_dir(root) {
            bases.extend(entries.flatten().map(|e| e.path()));
        }
        bases
            .into_iter()
            .map(|base| base.join(relative))
            .filter(|dir| dir.is_dir())
            .collect()
    }
}

/// Every pid in the cgroup tree `dir`.
fn pids_below(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pids_below(&entry.path(), pids);
            }
        }
    }
}

/// Removes the cgroup tree `dir`, deepest first (cgroupfs directories go with rmdir).
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    fs::remove_dir(dir)
}
