//! The files the installer touches: finding the node's active CNI config, replacing a file
//! atomically, and the backup kept beside an edited conflist.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use thiserror::Error;

use super::edit::Refusal;

/// Extensions runtimes (libcni's `ConfFiles`) read from the conf dir.
const CONFIG_EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// Suffix of the copy of a conflist as it was before ipq-cni edited it. Not a config
/// extension, so no runtime (and no CNI that scans the dir) ever loads it.
pub const BACKUP_SUFFIX: &str = ".ipq-bak";

#[derive(Debug, Error)]
pub enum FilesError {
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "no CNI config (*.conflist, *.conf, *.json) in {}: the node's network plugin has not \
         written one yet, and ipq-cni can only chain after it",
        dir.display()
    )]
    NoConfig { dir: PathBuf },
    #[error("{}: {reason}; left untouched", path.display())]
    Refused { path: PathBuf, reason: Refusal },
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FilesError + 'a {
    move |source| FilesError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

/// The config a runtime uses: the lexically first config file in `dir`, as libcni sorts them.
pub fn active_config(dir: &Path) -> Result<PathBuf, FilesError> {
    let entries = fs::read_dir(dir).map_err(io_error("listing the CNI conf dir", dir))?;
    let mut configs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_error("listing the CNI conf dir", dir))?;
        let path = entry.path();
        let is_config = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| CONFIG_EXTENSIONS.contains(&e));
        // `is_file` follows symlinks: a link to a config is a config.
        if is_config && path.is_file() {
            configs.push(path);
        }
    }
    configs.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    configs
        .into_iter()
        .next()
        .ok_or_else(|| FilesError::NoConfig {
            dir: dir.to_owned(),
        })
}

/// Whether `path` is a conflist (the only kind whose plugins a runtime chains).
pub fn is_conflist(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "conflist")
}

/// Reads a config as text; a file that is not UTF-8 is refused, not an I/O error.
pub fn read_config(path: &Path) -> Result<String, FilesError> {
    let bytes = fs::read(path).map_err(io_error("reading", path))?;
    String::from_utf8(bytes).map_err(|e| FilesError::Refused {
        path: path.to_owned(),
        reason: Refusal::NotJson(format!("not UTF-8: {e}")),
    })
}

/// Where the backup of `config` lives.
pub fn backup_path(config: &Path) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(BACKUP_SUFFIX);
    config.with_file_name(name)
}

/// Replaces `path` with `contents` so that a reader sees the old file or the new one, never a
/// mix: a temporary file in the same directory, fsynced, renamed over it, the directory
/// fsynced. Mode and owner are kept from the file it replaces, else `mode` is used. A symlink
/// is followed: the file it points to is replaced, the link stays.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), FilesError> {
    let target = match fs::canonicalize(path) {
        Ok(resolved) => resolved,
        Err(e) if e.kind() == io::ErrorKind::NotFound => path.to_owned(),
        Err(e) => return Err(io_error("resolving", path)(e)),
    };
    let dir = target.parent().unwrap_or(Path::new("."));
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(target.file_name().unwrap_or_default());
    tmp_name.push(".ipq-tmp");
    let tmp = dir.join(tmp_name);
    let existing = fs::metadata(&target).ok();
    let mode = existing.as_ref().map_or(mode, |m| m.permissions().mode());

    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_error("creating", &tmp))?;
        file.write_all(contents)
            .map_err(io_error("writing", &tmp))?;
        // The umask applies at creation; set the mode explicitly.
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_error("setting the mode of", &tmp))?;
        if let Some(meta) = &existing {
            std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))
                .map_err(io_error("setting the owner of", &tmp))?;
        }
        file.sync_all().map_err(io_error("syncing", &tmp))?;
        fs::rename(&tmp, &target).map_err(io_error("renaming into place", &target))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("syncing the directory", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Copies the plugin binary to `<bin_dir>/ipq-cni` atomically; `false` if it is already there
/// with the same contents.
pub fn install_binary(source: &Path, bin_dir: &Path) -> Result<bool, FilesError> {
    install_binary_as(source, bin_dir, super::edit::PLUGIN_TYPE)
}

/// Copies the plugin `source` into `bin_dir` as `name`; `false` if it was there already.
pub fn install_binary_as(source: &Path, bin_dir: &Path, name: &str) -> Result<bool, FilesError> {
    let dest = bin_dir.join(name);
    let contents = fs::read(source).map_err(io_error("reading the plugin binary", source))?;
    if fs::read(&dest).is_ok_and(|existing| existing == contents) {
        return Ok(false);
    }
    // A new file gets 0755; an existing one keeps its mode, but must stay executable.
    write_atomically(&dest, &contents, 0o755)?;
    let mode = fs::metadata(&dest)
        .map_err(io_error("reading", &dest))?
        .permissions()
        .mode();
    if mode & 0o111 != 0o111 {
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode | 0o555))
            .map_err(io_error("making executable", &dest))?;
    }
    Ok(true)
}

/// Removes `path` if it exists; `false` if it did not.
pub fn remove_if_present(path: &Path) -> Result<bool, FilesError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("removing", path)(e)),
    }
}
