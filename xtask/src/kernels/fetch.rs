//! Debian kernel packages: downloaded with apt through a private sources list (the machine's
//! apt configuration is never touched; signatures are checked against Debian's archive
//! keyring), unpacked with `dpkg-deb -x` and indexed with `busybox depmod`, all cached under
//! `target/kernels/`: a kernel already unpacked costs nothing and needs no network.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::{cache_dir, Kernel};
use crate::cross::Arch;
use crate::util::{self, cmd};

/// Debian's archive keyring (package debian-archive-keyring): what apt checks the private
/// sources' Release files against.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// An unpacked kernel package.
pub struct Tree {
    /// `boot/vmlinuz-<version>`.
    pub vmlinuz: PathBuf,
    /// `lib/modules/<version>`, with a `modules.dep`.
    pub modules: PathBuf,
}

/// Downloads what is not cached yet. `apt-get update` of the private lists runs at most once
/// per xtask run, and only when a package has to be downloaded.
pub struct Fetcher {
    arch: Arch,
    sources: Vec<String>,
    updated: bool,
}

impl Fetcher {
    /// `all` is every kernel of the config: the private sources list has all the suites of
    /// `arch`'s kernels, so it stays the same whichever kernels a run selects. Each
    /// architecture has its own apt state (`target/kernels/apt`, `apt-arm64`).
    pub fn new(arch: Arch, all: &[Kernel]) -> Fetcher {
        let mut sources: Vec<String> = all
            .iter()
            .filter(|k| k.arch == arch)
            .map(|k| k.source.clone())
            .collect();
        sources.sort();
        sources.dedup();
        Fetcher {
            arch,
            sources,
            updated: false,
        }
    }

    /// The unpacked tree of `kernel`, downloading and unpacking it first if needed.
    pub fn kernel(&mut self, kernel: &Kernel) -> Result<Tree> {
        let root = cache_dir().join("unpacked").join(&kernel.package);
        if !root.join(".complete").is_file() {
            let deb = self.download(kernel)?;
            unpack(&deb, &root)?;
        }
        tree(&root).with_context(|| {
            format!(
                "{} has no usable kernel: remove it to unpack {} again",
                root.display(),
                kernel.package
            )
        })
    }

    fn download(&mut self, kernel: &Kernel) -> Result<PathBuf> {
        let debs = cache_dir().join("debs");
        if let Some(deb) = crate::foreign_debs::find_deb(&debs, &kernel.package)? {
            return Ok(deb);
        }
        self.update()?;
        fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
        let package = match apt_download(self.arch, &kernel.package, &debs) {
            Ok(()) => kernel.package.clone(),
            Err(e) => {
                // Debian removes a kernel package from its archive once an update supersedes
                // it; CI on a fresh machine must not break the day that happens.
                let Some(successor) = self.successor(&kernel.package)? else {
                    return Err(e.context(format!(
                        "cannot download {} from {}, and the archive has no other package of \
                         its series: pick one (apt-cache search) and edit xtask/kernels.toml",
                        kernel.package, kernel.source
                    )));
                };
                eprintln!(
                    "kernels: {} is no longer in the archive ({e:#}); using its successor {} \
                     — update xtask/kernels.toml",
                    kernel.package, successor
                );
                apt_download(self.arch, &successor, &debs)?;
                successor
            }
        };
        crate::foreign_debs::find_deb(&debs, &package)?.with_context(|| {
            format!(
                "apt-get download {package} succeeded but no {package}_*.deb is in {}",
                debs.display()
            )
        })
    }

    /// The newest package of the same kernel series and flavour as `package` in the private
    /// sources (`linux-image-6.12.100+deb12-cloud-amd64` → the highest
    /// `linux-image-6.12.*-cloud-amd64`), if there is one other than `package`.
    fn successor(&mut self, package: &str) -> Result<Option<String>> {
        let Some(series) = series_prefix(package) else {
            return Ok(None);
        };
        let names = util::output(apt(self.arch, "apt-cache").args(["pkgnames", &series]))
            .context("apt-cache pkgnames")?;
        Ok(newest_of_series(package, names.lines()))
    }

    /// `apt-get update` of the private lists.
    fn update(&mut self) -> Result<()> {
        if self.updated {
            return Ok(());
        }
        if !Path::new(KEYRING).is_file() {
            bail!(
                "{KEYRING} is missing: install debian-archive-keyring (cargo xtask setup does), \
                 apt checks the kernels' signatures against it"
            );
        }
        let dir = apt_dir(self.arch);
        for sub in ["lists/partial", "cache/archives/partial"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
        }
        let list: String = self
            .sources
            .iter()
            .map(|source| {
                format!(
                    "deb [arch={} signed-by={KEYRING}] {source} main\n",
                    self.arch.name()
                )
            })
            .collect();
        let path = dir.join("sources.list");
        fs::write(&path, list).with_context(|| format!("cannot write {}", path.display()))?;
        util::run(apt(self.arch, "apt-get").arg("update")).with_context(|| {
            format!(
                "`apt-get update` of the kernel tier's private sources ({}) failed; check \
                 network access to deb.debian.org",
                path.display()
            )
        })?;
        self.updated = true;
        Ok(())
    }
}

fn apt_download(arch: Arch, package: &str, into: &Path) -> Result<()> {
    let mut download = apt(arch, "apt-get");
    download.args(["download", package]).current_dir(into);
    util::run(&mut download).with_context(|| format!("apt-get download {package}"))
}

/// `linux-image-6.12.` of `linux-image-6.12.100+deb12-cloud-amd64`: what every package of the
/// series starts with.
fn series_prefix(package: &str) -> Option<String> {
    let version = package.strip_prefix("linux-image-")?;
    let mut parts = version.splitn(3, '.');
    let (major, minor) = (parts.next()?, parts.next()?);
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (numeric(major) && numeric(minor) && parts.next().is_some())
        .then(|| format!("linux-image-{major}.{minor}."))
}

/// Of `names`, the newest other than `package` with its series prefix and its flavour (what
/// follows the last version digit run: `-cloud-amd64`, `+deb12-cloud-amd64`), compared by their
/// digit runs (`6.12.100` < `6.12.101`, ABI `-46` < `-47`).
fn newest_of_series<'a>(package: &str, names: impl Iterator<Item = &'a str>) -> Option<String> {
    let series = series_prefix(package)?;
    let flavour = |name: &str| -> String {
        let rest = name.strip_prefix(&series).unwrap_or(name);
        let start = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
            .unwrap_or(rest.len());
        rest[start..].to_owned()
    };
    let digits = |name: &str| -> Vec<u64> {
        name.split(|c: char| !c.is_ascii_digit())
            .filter(|run| !run.is_empty())
            .filter_map(|run| run.parse().ok())
            .collect()
    };
    let want = flavour(package);
    names
        .map(str::trim)
        .filter(|name| *name != package && name.starts_with(&series) && flavour(name) == want)
        .filter(|name| !name.contains("-dbg") && !name.contains("-unsigned"))
        .max_by_key(|name| digits(name))
        .map(str::to_owned)
}

/// `target/kernels/apt` (amd64) or `target/kernels/apt-<arch>`: the private sources list,
/// package lists and cache.
fn apt_dir(arch: Arch) -> PathBuf {
    match arch {
        Arch::Amd64 => cache_dir().join("apt"),
        other => cache_dir().join(format!("apt-{}", other.name())),
    }
}

/// An apt command that reads only the private sources list of `arch`, keeps its lists and
/// cache under [`apt_dir`], and takes `arch`'s packages (the machine's own list of
/// architectures is left alone).
fn apt(arch: Arch, program: &str) -> std::process::Command {
    crate::foreign_debs::private_apt(program, &apt_dir(arch), arch.name())
}

/// Unpacks `deb` into `root` and indexes its modules; `root/.complete` marks a finished job.
fn unpack(deb: &Path, root: &Path) -> Result<()> {
    let mut partial = root.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        fs::remove_dir_all(&partial)
            .with_context(|| format!("cannot remove {}", partial.display()))?;
    }
    fs::create_dir_all(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    util::run(cmd("dpkg-deb", ["-x"]).arg(deb).arg(&partial))
        .with_context(|| format!("cannot unpack {}", deb.display()))?;
    let modules = modules_dir(&partial)?;
    let version = modules.file_name().context("modules dir has a name")?;
    // The package's modules.dep is made by depmod when it is installed: make it here.
    util::run(cmd("busybox", ["depmod", "-b"]).arg(&partial).arg(version))
        .context("`busybox depmod` failed (busybox-static is in setup's package list)")?;
    fs::write(partial.join(".complete"), "")?;
    if root.exists() {
        fs::remove_dir_all(root).with_context(|| format!("cannot remove {}", root.display()))?;
    }
    fs::rename(&partial, root)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), root.display()))
}

/// The one `lib/modules/<version>` of an unpacked kernel package.
fn modules_dir(root: &Path) -> Result<PathBuf> {
    let base = root.join("lib/modules");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&base)
        .with_context(|| format!("no {} in the package", base.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    match dirs.len() {
        1 => Ok(dirs.remove(0)),
        n => bail!("{} has {n} module directories, expected 1", base.display()),
    }
}

fn tree(root: &Path) -> Result<Tree> {
    let modules = modules_dir(root)?;
    let version = modules
        .file_name()
        .context("modules dir has a name")?
        .to_string_lossy()
        .into_owned();
    let vmlinuz = root.join("boot").join(format!("vmlinuz-{version}"));
    if !vmlinuz.is_file() {
        bail!("no {}", vmlinuz.display());
    }
    if !modules.join("modules.dep").is_file() {
        bail!("no modules.dep in {}", modules.display());
    }
    Ok(Tree { vmlinuz, modules })
}

#[cfg(test)]
mod tests {
    use super::{newest_of_series, series_prefix};

    #[test]
    fn a_superseded_kernel_is_replaced_by_the_newest_of_its_series_and_flavour() {
        let names = [
            "linux-image-6.12.99+deb12-cloud-amd64",
            "linux-image-6.12.101+deb12-cloud-amd64",
            "linux-image-6.12.101+deb12-amd64",
            "linux-image-6.12.101+deb12-cloud-amd64-dbg",
            "linux-image-6.1.0-47-cloud-amd64",
        ];
        assert_eq!(
            newest_of_series("linux-image-6.12.100+deb12-cloud-amd64", names.into_iter()),
            Some("linux-image-6.12.101+deb12-cloud-amd64".into())
        );
        let names = [
            "linux-image-5.10.0-46-cloud-amd64",
            "linux-image-5.10.0-47-cloud-amd64",
            "linux-image-5.10.0-47-amd64",
            "linux-image-5.10.0-47-rt-amd64",
        ];
        assert_eq!(
            newest_of_series("linux-image-5.10.0-46-cloud-amd64", names.into_iter()),
            Some("linux-image-5.10.0-47-cloud-amd64".into())
        );
        assert_eq!(
            newest_of_series(
                "linux-image-6.1.0-47-cloud-amd64",
                ["linux-image-6.1.0-47-cloud-amd64"].into_iter()
            ),
            None,
            "the package itself is no successor"
        );
        assert_eq!(series_prefix("linux-image-amd64"), None);
    }
}
