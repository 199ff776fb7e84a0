//! Debian packages of another architecture (arm64 on an x86-64 machine), for what runs on that
//! architecture but is not built here: the arm64 image's static busybox, the arm64 kernel
//! tier's userland. Downloaded with apt through private state under `target/debian-<arch>/`
//! (the machine's apt configuration, and its list of architectures, are never touched;
//! signatures are checked against Debian's archive keyring), unpacked with `dpkg-deb -x`,
//! cached: a package already unpacked costs nothing and needs no network.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::util::{self, cmd};

/// Debian's archive keyring (package debian-archive-keyring).
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The release the packages come from: the one these machines run (bookworm), so that the
/// foreign binaries are the same versions as the host's.
const SOURCES: [&str; 2] = [
    "http://deb.debian.org/debian bookworm main",
    "http://deb.debian.org/debian-security bookworm-security main",
];

/// Downloads and unpacks packages of one Debian architecture.
pub struct ForeignDebs {
    arch: &'static str,
    dir: PathBuf,
    updated: bool,
}

impl ForeignDebs {
    /// For Debian architecture `arch` (`arm64`).
    pub fn new(arch: &'static str) -> ForeignDebs {
        let dir = util::workspace_root()
            .join("target")
            .join(format!("debian-{arch}"));
        ForeignDebs {
            arch,
            dir,
            updated: false,
        }
    }

    /// The directory `package` is unpacked into (downloading and unpacking it first if
    /// needed).
    pub fn unpacked(&mut self, package: &str) -> Result<PathBuf> {
        let root = self.dir.join("unpacked").join(package);
        if root.join(".complete").is_file() {
            return Ok(root);
        }
        let debs = self.dir.join("debs");
        let deb = match find_deb(&debs, package)? {
            Some(deb) => deb,
            None => {
                self.update()?;
                fs::create_dir_all(&debs)
                    .with_context(|| format!("cannot create {}", debs.display()))?;
                let mut download = self.apt("apt-get");
                download
                    .args(["download", &format!("{package}:{}", self.arch)])
                    .current_dir(&debs);
                util::run(&mut download)
                    .with_context(|| format!("apt-get download {package}:{} failed", self.arch))?;
                find_deb(&debs, package)?.with_context(|| {
                    format!(
                        "apt-get download {package} succeeded but no {package}_*.deb is in {}",
                        debs.display()
                    )
                })?
            }
        };
        if root.exists() {
            fs::remove_dir_all(&root)
                .with_context(|| format!("cannot remove {}", root.display()))?;
        }
        fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
        util::run(cmd("dpkg-deb", ["-x"]).arg(&deb).arg(&root))
            .with_context(|| format!("cannot unpack {}", deb.display()))?;
        fs::write(root.join(".complete"), "")?;
        Ok(root)
    }

    /// `apt-get update` of the private lists, once per run and only when a download is needed.
    fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        if !Path::new(KEYRING).is_file() {
            bail!(
                "{KEYRING} is missing: install debian-archive-keyring (cargo xtask setup does); \
                 apt checks the packages' signatures against it"
            );
        }
        for sub in ["lists/partial", "cache/archives/partial"] {
            let path = self.dir.join(sub);
            fs::create_dir_all(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
        }
        let list: String = SOURCES
            .iter()
            .map(|source| format!("deb [arch={} signed-by={KEYRING}] {source}\n", self.arch))
            .collect();
        let path = self.dir.join("sources.list");
        fs::write(&path, list).with_context(|| format!("cannot write {}", path.display()))?;
        util::run(self.apt("apt-get").arg("update")).with_context(|| {
            format!(
                "`apt-get update` of the private {} sources ({}) failed; check network access \
                 to deb.debian.org",
                self.arch,
                path.display()
            )
        })?;
        self.updated = true;
        Ok(())
    }

    /// `program` (apt-get) with the private sources, lists, cache and architecture.
    fn apt(&self, program: &str) -> std::process::Command {
        private_apt(program, &self.dir, self.arch)
    }
}

/// `program` (apt-get) reading only the sources list in `dir`, keeping its lists and cache
/// there, and taking `arch`'s packages (the machine's own list of architectures is left
/// alone): the kernel tier's downloads and these share it.
pub(crate) fn private_apt(program: &str, dir: &Path, arch: &str) -> std::process::Command {
    let opt = |key: &str, value: &Path| format!("{key}={}", value.display());
    let mut command = cmd(program, ["-q"]);
    command
        .arg("-o")
        .arg(opt("Dir::Etc::sourcelist", &dir.join("sources.list")))
        .args(["-o", "Dir::Etc::sourceparts=-"])
        .arg("-o")
        .arg(opt("Dir::State::Lists", &dir.join("lists")))
        .arg("-o")
        .arg(opt("Dir::Cache", &dir.join("cache")))
        .args(["-o", &format!("APT::Architecture={arch}")])
        .args(["-o", &format!("APT::Architectures={arch}")]);
    command
}

/// The `.deb` of `package` in `dir`, if one was downloaded.
pub(crate) fn find_deb(dir: &Path, package: &str) -> Result<Option<PathBuf>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(None);
    };
    let prefix = format!("{package}_");
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".deb") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}
