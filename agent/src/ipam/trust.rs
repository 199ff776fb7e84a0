//! Which delegate binaries the agent runs. A held release comes from the API (any member of
//! `api_group`) or from the spool, and the agent runs its delegate's DEL as root: were
//! `cniPath` and `delegateType` taken as given, anyone allowed on the API could run any binary
//! as root. So the agent only runs a plugin by its bare name (`is_plugin_name`), found in the
//! CNI bin directories the operator configured (`ipam_cni_bin_dirs`) that the release's
//! `cniPath` also names, and only a regular file that neither group nor others can write,
//! that root (or the agent's own user) owns, in directories (up to `/`) that nobody else may
//! write either (a sticky one, as `/tmp`, lets nobody replace another's file).
//!
//! Directories are compared as written, component by component (`/opt/cni/bin/` is
//! `/opt/cni/bin`, `/opt/cni/bin/../x` is not): no symlink or `..` is resolved, so a release
//! cannot name its way into a trusted directory. A symlink inside a trusted directory (a node's
//! plugin dir linking a distribution's plugins) is followed, and its target checked.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use ipq_api::model::{is_plugin_name, HeldRelease};

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
    #[error("{}: {reason}; the agent runs no delegate it cannot trust", path.display())]
    Unsafe { path: PathBuf, reason: String },
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

    /// The delegate binary of `release`: in its first trusted `cniPath` directory that has a
    /// file of that name (as libcni's `FindInPath`), and safe to run as root.
    pub fn find(&self, release: &HeldRelease) -> Result<PathBuf, TrustError> {
        self.check(release)?;
        let dirs = self.dirs_of(release)?;
        let kind = &release.delegate_type;
        let found = dirs
            .iter()
            .map(|dir| dir.join(kind))
            .find(|candidate| candidate.exists());
        match found {
            Some(path) => {
                safe_to_run(&path)?;
                Ok(path)
            }
            None => Err(TrustError::NotFound {
                kind: kind.clone(),
                dirs: dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

/// A binary root may run: a regular executable file (a symlink's target) owned by root or by
/// the agent's user, writable by neither group nor others (who could otherwise replace what
/// root runs).
fn safe_to_run(path: &Path) -> Result<(), TrustError> {
    let unsafe_because = |reason: String| TrustError::Unsafe {
        path: path.to_owned(),
        reason,
    };
    let meta = path
        .metadata()
        .map_err(|e| unsafe_because(format!("cannot be inspected: {e}")))?;
    if !meta.is_file() {
        return Err(unsafe_because("not a regular file".into()));
    }
    let mode = meta.mode();
    if mode & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "mode {:o} lets group or others write it",
            mode & 0o7777
        )));
    }
    if mode & 0o111 == 0 {
        return Err(unsafe_because("not executable".into()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(unsafe_because(format!(
            "owned by uid {}, neither root nor the agent's user",
            meta.uid()
        )));
    }
    // Whoever may write a directory on the way may put another file in this one's place.
    let real = path
        .canonicalize()
        .map_err(|e| unsafe_because(format!("cannot be resolved: {e}")))?;
    for dir in real.ancestors().skip(1) {
        let meta = dir
            .metadata()
            .map_err(|e| unsafe_because(format!("{} cannot be inspected: {e}", dir.display())))?;
        let mode = meta.mode();
        // A sticky directory (/tmp) lets nobody replace an entry they do not own.
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(unsafe_because(format!(
                "directory {} (mode {:o}) lets group or others replace what is in it",
                dir.display(),
                mode & 0o7777
            )));
        }
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(unsafe_because(format!(
                "directory {} is owned by uid {}, neither root nor the agent's user",
                dir.display(),
                meta.uid()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn release(cni_path: &str, kind: &str) -> HeldRelease {
        HeldRelease {
            network: Some("net".into()),
            cni_version: "1.0.0".into(),
            delegate_type: kind.into(),
            delegate_conf: serde_json::json!({}),
            container_id: "c0ffee".into(),
            ifname: "eth0".into(),
            cni_args: None,
            cni_path: cni_path.into(),
            netns: None,
            addresses: Vec::new(),
            held_at_unix_ms: 0,
        }
    }

    fn plugin(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn only_trusted_cni_path_directories_count() {
        let trusted = TrustedBins::new(vec!["/opt/cni/bin".into(), "/usr/lib/cni".into()]);
        let dirs = trusted
            .dirs_of(&release(
                "/tmp/evil:/usr/lib/cni/:/opt/cni/bin",
                "host-local",
            ))
            .unwrap();
        assert_eq!(
            dirs,
            [
                PathBuf::from("/usr/lib/cni/"),
                PathBuf::from("/opt/cni/bin")
            ]
        );
        for untrusted in [
            "/tmp/evil",
            "/opt/cni/bin/../../tmp",
            "/opt/cni",
            "/opt/cni/bin/x",
        ] {
            let err = trusted
                .dirs_of(&release(untrusted, "host-local"))
                .expect_err(untrusted);
            assert!(
                err.to_string().contains("ipam_cni_bin_dirs"),
                "{untrusted}: {err}"
            );
        }
        let err = trusted
            .check(&release("/opt/cni/bin", "../../bin/sh"))
            .expect_err("a path");
        assert!(matches!(err, TrustError::NotAPluginName(_)), "{err}");
    }

    #[test]
    fn the_first_trusted_directory_holding_the_plugin_wins() {
        let (a, b, other) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        plugin(other.path(), "host-local", 0o755);
        let wanted = plugin(b.path(), "host-local", 0o755);
        let trusted = TrustedBins::new(vec![a.path().into(), b.path().into()]);
        let cni_path = format!(
            "{}:{}:{}",
            other.path().display(),
            a.path().display(),
            b.path().display()
        );
        assert_eq!(
            trusted.find(&release(&cni_path, "host-local")).unwrap(),
            wanted
        );
        let err = trusted
            .find(&release(&cni_path, "static"))
            .expect_err("absent");
        assert!(matches!(err, TrustError::NotFound { .. }), "{err}");
    }

    #[test]
    fn a_binary_others_could_replace_is_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let trusted = TrustedBins::new(vec![dir.path().into()]);
        let cni_path = dir.path().display().to_string();
        for (name, mode) in [("group-writable", 0o775), ("world-writable", 0o757)] {
            plugin(dir.path(), name, mode);
            let err = trusted
                .find(&release(&cni_path, name))
                .expect_err("writable");
            assert!(err.to_string().contains("group or others"), "{err}");
        }
        plugin(dir.path(), "not-executable", 0o644);
        let err = trusted
            .find(&release(&cni_path, "not-executable"))
            .expect_err("not executable");
        assert!(err.to_string().contains("not executable"), "{err}");
        std::fs::create_dir(dir.path().join("a-dir")).unwrap();
        let err = trusted
            .find(&release(&cni_path, "a-dir"))
            .expect_err("a directory");
        assert!(err.to_string().contains("not a regular file"), "{err}");
        // A directory on the way that others may write: they could swap the file.
        let open = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        plugin(open.path(), "in-an-open-dir", 0o755);
        let open_trusted = TrustedBins::new(vec![open.path().into()]);
        let err = open_trusted
            .find(&release(
                &open.path().display().to_string(),
                "in-an-open-dir",
            ))
            .expect_err("an open directory");
        assert!(err.to_string().contains("replace what is in it"), "{err}");
        // A link in a trusted directory is followed, and its target is what is checked.
        let target = tempfile::tempdir().unwrap();
        let real = plugin(target.path(), "real", 0o755);
        std::os::unix::fs::symlink(&real, dir.path().join("linked")).unwrap();
        assert!(trusted.find(&release(&cni_path, "linked")).is_ok());
    }
}
