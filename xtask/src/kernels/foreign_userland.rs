//! The guest's userland for a kernel of another architecture (arm64 on an x86-64 machine):
//! the same tools as the host's guests (a static busybox, iproute2's `ip` and `tc`, iputils'
//! `ping`, util-linux's `unshare`), taken from Debian's packages of that architecture, and the
//! shared libraries every guest executable needs (the tools' and the cross-built test and
//! agent binaries'), found by their ELF `NEEDED` entries (ldd cannot run a foreign binary).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::cross::Arch;
use crate::foreign_debs::ForeignDebs;
use crate::util::{self, cmd};

/// The Debian packages of the tools and of every library they and the Rust binaries link,
/// as bookworm builds them (`ldd` of the host's copies lists the same sonames). A soname no
/// package here has fails the initramfs naming it.
const PACKAGES: [&str; 16] = [
    "busybox-static",
    "iproute2",
    "iputils-ping",
    "util-linux",
    "libc6",
    "libgcc-s1",
    "libbpf1",
    "libelf1",
    "libmnl0",
    "libbsd0",
    "libcap2",
    "zlib1g",
    "libmd0",
    "libxtables12",
    "libidn2-0",
    "libunistring2",
];

/// Guest files: guest path → (mode, host path).
pub type Files = BTreeMap<String, (u32, PathBuf)>;

/// The unpacked packages of one architecture.
pub struct ForeignUserland {
    arch: Arch,
    roots: Vec<PathBuf>,
    busybox: PathBuf,
}

impl ForeignUserland {
    /// Downloads and unpacks (or finds cached) [`PACKAGES`] for `arch`.
    pub fn fetch(arch: Arch) -> Result<ForeignUserland> {
        let mut debs = ForeignDebs::new(arch.name());
        let mut roots = Vec::new();
        for package in PACKAGES {
            roots.push(debs.unpacked(package)?);
        }
        let busybox = roots[0].join("bin/busybox");
        crate::cross::check_machine(&busybox, arch)?;
        Ok(ForeignUserland {
            arch,
            roots,
            busybox,
        })
    }

    /// The static busybox.
    pub fn busybox(&self) -> &Path {
        &self.busybox
    }

    /// The file of the tool `name` (a regular file in a `bin` or `sbin` directory of the
    /// packages).
    pub fn tool(&self, name: &str) -> Result<PathBuf> {
        for root in &self.roots {
            for dir in ["bin", "sbin", "usr/bin", "usr/sbin"] {
                let path = root.join(dir).join(name);
                let is_file = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
                if is_file {
                    return Ok(path);
                }
            }
        }
        bail!(
            "no {} package of {} has the tool {name}",
            self.arch.name(),
            PACKAGES.join(", ")
        )
    }

    /// Adds `host` (an executable of this architecture) as `guest`, with its program
    /// interpreter and every library it needs, transitively, at the paths a Debian of this
    /// architecture has them.
    pub fn add_with_libraries(&self, files: &mut Files, guest: &str, host: &Path) -> Result<()> {
        crate::cross::check_machine(host, self.arch)?;
        files.insert(guest.to_owned(), (0o755, host.to_owned()));
        let program = readelf("-l", host)?;
        let Some(interpreter) = program.lines().find_map(|l| {
            l.split_once("[Requesting program interpreter: ")
                .map(|(_, rest)| rest.trim_end_matches(']').to_owned())
        }) else {
            return Ok(()); // static
        };
        let loader = Path::new(&interpreter)
            .file_name()
            .context("the interpreter has a file name")?
            .to_string_lossy()
            .into_owned();
        files.insert(interpreter, (0o755, self.library(&loader)?));
        let mut pending = vec![host.to_owned()];
        let mut seen = BTreeSet::new();
        while let Some(file) = pending.pop() {
            for name in needed(&file)? {
                if !seen.insert(name.clone()) {
                    continue;
                }
                let library = self
                    .library(&name)
                    .with_context(|| format!("{} needs {name}", file.display()))?;
                files.insert(
                    format!("/lib/{}/{name}", self.multiarch()),
                    (0o755, library.clone()),
                );
                pending.push(library);
            }
        }
        Ok(())
    }

    /// Debian's multiarch directory name.
    fn multiarch(&self) -> &'static str {
        match self.arch {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// The file of the library `soname`, symlinks inside its package followed.
    fn library(&self, soname: &str) -> Result<PathBuf> {
        let multiarch = self.multiarch();
        for root in &self.roots {
            for dir in [format!("lib/{multiarch}"), format!("usr/lib/{multiarch}")] {
                let path = root.join(&dir).join(soname);
                if fs::symlink_metadata(&path).is_err() {
                    continue;
                }
                let real = fs::canonicalize(&path)
                    .with_context(|| format!("cannot resolve {}", path.display()))?;
                if !real.starts_with(root) {
                    bail!("{} points out of its package", path.display());
                }
                return Ok(real);
            }
        }
        bail!(
            "no {} package of {} has {soname}: add its package to PACKAGES in {}",
            self.arch.name(),
            PACKAGES.join(", "),
            file!()
        )
    }
}

/// The `NEEDED` sonames of an ELF file.
fn needed(file: &Path) -> Result<Vec<String>> {
    Ok(readelf("-d", file)?
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| {
            l.split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .map(|(n, _)| n.to_owned())
        })
        .collect())
}

fn readelf(what: &str, file: &Path) -> Result<String> {
    util::output(cmd("readelf", ["-W", what]).arg(file))
        .with_context(|| format!("readelf {what} {} (binutils)", file.display()))
}
