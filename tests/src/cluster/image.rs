//! ipq's image for the cluster tier, made without a Docker engine: what
//! `deploy/docker/Dockerfile` ships (ipq-agent, ipq, ipq-cni, ipq-ipam from the release build,
//! in /usr/local/bin), on a minimal base of the machine's own instead of Debian's slim image:
//! Debian's static busybox for the shell, grep and mount the DaemonSet's init step runs, and
//! the shared libraries the binaries link (read with ldd), at the paths they are linked at.
//!
//! The same image for arm64 ([`build_for`] with [`Arch::Arm64`]) from the aarch64 build
//! (`cargo xtask build --arch arm64`, which also stages Debian's arm64 static busybox in
//! `target/aarch64-unknown-linux-gnu/busybox`), its libraries taken from Debian's cross libc
//! (`/usr/aarch64-linux-gnu/lib`, package libc6-arm64-cross: the arm64 libc6 relocated) and
//! placed where an arm64 Debian has them. ldd cannot list a foreign binary's libraries:
//! `readelf` reads the ELF's interpreter and NEEDED entries instead.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

/// The image the tier installs ipq's chart with (its `image.repository` and `image.tag`), in
/// place of the shipped one.
pub const IPQ_IMAGE: &str = "ipq.test/ipq/ipq:cluster-tier";

/// The previous release's image, for the tier's upgrade node by node: what it rolls back to
/// and forward from. Made of the binaries `cargo xtask previous-release` built from the commit
/// `xtask/previous-release.toml` names ([`previous_release`]).
pub const IPQ_IMAGE_PREVIOUS: &str = "ipq.test/ipq/ipq:previous-release";

/// The environment variable naming the previous release's directory (xtask's cluster tier sets
/// it).
pub const PREVIOUS_RELEASE_ENV: &str = "IPQ_PREVIOUS_RELEASE";

/// The file in every image made here that holds the image's own name.
pub const IMAGE_NAME_FILE: &str = "etc/ipq-test-image";

/// The binaries the Dockerfile copies into /usr/local/bin.
pub const SHIPPED_BINARIES: [&str; 4] = ["ipq-agent", "ipq", "ipq-cni", "ipq-ipam"];

/// What the DaemonSet's steps run besides the binaries, and what a human would type in
/// `kubectl exec`.
const APPLETS: [&str; 12] = [
    "sh", "grep", "mount", "cat", "echo", "ls", "sleep", "ps", "mkdir", "rm", "test", "[",
];

/// The architectures ipq's image is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// The OCI (and `kubernetes.io/arch`) name.
    pub const fn oci_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// Rust's target triple, the directory under `target/` of a cross build.
    pub const fn triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// `e_machine` of its ELF executables.
    pub const fn elf_machine(self) -> u16 {
        match self {
            Arch::Amd64 => 62,
            Arch::Arm64 => 183,
        }
    }

    /// The machine's own.
    pub fn host() -> Arch {
        if cfg!(target_arch = "aarch64") {
            Arch::Arm64
        } else {
            Arch::Amd64
        }
    }
}

/// The `e_machine` of a 64-bit little-endian ELF file.
pub fn elf_machine(path: &Path) -> anyhow::Result<u16> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    match bytes.get(..20) {
        Some(header) if header[..4] == *b"\x7fELF" && header[4] == 2 && header[5] == 1 => {
            Ok(u16::from_le_bytes([header[18], header[19]]))
        }
        _ => bail!("{} is not a 64-bit little-endian ELF file", path.display()),
    }
}

/// What an image for `arch` is made of: the directory with the four binaries, the static
/// busybox.
pub struct ImageSource {
    pub arch: Arch,
    pub binaries: PathBuf,
    pub busybox: PathBuf,
}

impl ImageSource {
    /// The cluster tier's: the host's release build and `/bin/busybox`.
    pub fn host_release() -> ImageSource {
        ImageSource {
            arch: Arch::host(),
            binaries: Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release"),
            busybox: PathBuf::from("/bin/busybox"),
        }
    }

    /// A cross build for `arch` (`cargo xtask build --arch <arch> [--release]`):
    /// `target/<triple>/<profile>` and the busybox it staged in `target/<triple>/busybox`.
    pub fn cross(arch: Arch, profile: &str) -> ImageSource {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target")
            .join(arch.triple());
        ImageSource {
            arch,
            binaries: dir.join(profile),
            busybox: dir.join("busybox"),
        }
    }
}

/// `target/release/<name>`: the release build the image is made of.
pub fn release_binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/release")
        .join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: the cluster tier deploys the release build (cargo build --release \
             -p ipq -p ipq-cni -p ipq-cli --bins; cargo xtask test-cluster does it)",
            path.display()
        );
    }
    Ok(path)
}

/// Writes the image's OCI archive under `work`; its path.
pub fn build(work: &Path) -> anyhow::Result<PathBuf> {
    let source = ImageSource::host_release();
    for name in SHIPPED_BINARIES {
        release_binary(name)?;
    }
    build_named(work, &source, IPQ_IMAGE)
}

/// The previous release built by `cargo xtask previous-release`: its binaries (`bin/`), its
/// Helm chart (`chart/`) and the commit it is (`commit`).
pub struct PreviousRelease {
    pub dir: PathBuf,
    pub commit: String,
}

impl PreviousRelease {
    pub fn chart(&self) -> PathBuf {
        self.dir.join("chart")
    }
}

/// The previous release [`PREVIOUS_RELEASE_ENV`] names; fails saying how to build it.
pub fn previous_release() -> anyhow::Result<PreviousRelease> {
    let dir = std::env::var_os(PREVIOUS_RELEASE_ENV).with_context(|| {
        format!(
            "{PREVIOUS_RELEASE_ENV} is unset: the upgrade phase rolls back to the previous \
             release; `cargo xtask test-cluster` builds it and sets it, or set it to what \
             `cargo xtask previous-release` prints"
        )
    })?;
    let dir = PathBuf::from(dir);
    let commit = fs::read_to_string(dir.join("commit"))
        .with_context(|| {
            format!(
                "{}/commit: not a previous release's directory",
                dir.display()
            )
        })?
        .trim()
        .to_string();
    if !dir.join("chart/Chart.yaml").is_file() {
        bail!("{} has no chart/Chart.yaml", dir.display());
    }
    Ok(PreviousRelease { dir, commit })
}

/// Writes the OCI archive of the previous release's image ([`IPQ_IMAGE_PREVIOUS`]) under
/// `work`; its path.
pub fn build_previous(work: &Path, release: &PreviousRelease) -> anyhow::Result<PathBuf> {
    let source = ImageSource {
        arch: Arch::host(),
        binaries: release.dir.join("bin"),
        busybox: PathBuf::from("/bin/busybox"),
    };
    build_named(work, &source, IPQ_IMAGE_PREVIOUS)
}

/// Writes the OCI archive of the image made of `source` under `work`; its path. Fails, naming
/// the file, when a binary or the busybox is missing or is not for `source.arch`.
pub fn build_for(work: &Path, source: &ImageSource) -> anyhow::Result<PathBuf> {
    build_named(work, source, IPQ_IMAGE)
}

fn build_named(work: &Path, source: &ImageSource, image: &str) -> anyhow::Result<PathBuf> {
    let arch = source.arch;
    let cross = arch != Arch::host();
    let rootfs = work.join("rootfs");
    let bin = rootfs.join("bin");
    let local_bin = rootfs.join("usr/local/bin");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(&local_bin)?;
    for dir in ["proc", "sys", "dev", "etc", "tmp", "run", "var/lib"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::write(rootfs.join(IMAGE_NAME_FILE), format!("{image}\n"))?;
    let mut inputs = vec![source.busybox.clone()];
    inputs.extend(SHIPPED_BINARIES.map(|name| source.binaries.join(name)));
    for input in &inputs {
        if !input.is_file() {
            bail!(
                "{} is missing: build it for {} first (cargo xtask build --arch {}{})",
                input.display(),
                arch.oci_name(),
                arch.oci_name(),
                if source.binaries.ends_with("release") {
                    " --release"
                } else {
                    ""
                }
            );
        }
        let machine = elf_machine(input)?;
        if machine != arch.elf_machine() {
            bail!(
                "{} is for ELF machine {machine}, not {} ({})",
                input.display(),
                arch.oci_name(),
                arch.elf_machine()
            );
        }
    }
    fs::copy(&source.busybox, bin.join("busybox")).with_context(|| {
        format!(
            "copying {} (install busybox-static)",
            source.busybox.display()
        )
    })?;
    for applet in APPLETS {
        symlink("busybox", bin.join(applet))?;
    }
    // (path in the image, file on this machine)
    let mut libraries = Vec::new();
    for name in SHIPPED_BINARIES {
        let binary = source.binaries.join(name);
        fs::copy(&binary, local_bin.join(name))
            .with_context(|| format!("copying {}", binary.display()))?;
        if cross {
            libraries.extend(foreign_libraries(&binary, arch)?);
        } else {
            libraries.extend(
                linked_libraries(&binary)?
                    .into_iter()
                    .map(|l| (l.clone(), l)),
            );
        }
    }
    libraries.sort();
    libraries.dedup();
    for (library, file) in libraries {
        let inside = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        fs::create_dir_all(inside.parent().context("a library lives in a directory")?)?;
        // Copied through symlinks: the image holds the files themselves.
        fs::copy(&file, &inside).with_context(|| format!("copying {}", file.display()))?;
    }
    crate::oci::archive_for(
        &rootfs,
        work,
        image,
        arch.oci_name(),
        &["/usr/local/bin/ipq-agent"],
        &["PATH=/usr/local/bin:/bin"],
    )
}

/// Where Debian's cross libc for `arch` keeps its libraries on this machine, and where an
/// image of `arch` has them (the loader's default search path on a multiarch Debian).
fn foreign_library_dirs(arch: Arch) -> anyhow::Result<(&'static str, &'static str)> {
    match arch {
        Arch::Arm64 => Ok(("/usr/aarch64-linux-gnu/lib", "/lib/aarch64-linux-gnu")),
        Arch::Amd64 => bail!("an amd64 image is made on an amd64 machine here"),
    }
}

/// (path in the image, file on this machine) of the loader and every library `binary` needs,
/// transitively, read with readelf from the foreign ELF files.
fn foreign_libraries(binary: &Path, arch: Arch) -> anyhow::Result<Vec<(PathBuf, PathBuf)>> {
    let (host_dir, image_dir) = foreign_library_dirs(arch)?;
    let mut found = Vec::new();
    let interpreter = readelf(&["-l"], binary)?
        .lines()
        .find_map(|l| {
            l.split_once("[Requesting program interpreter: ")
                .map(|(_, rest)| rest.trim_end_matches(']').to_owned())
        })
        .with_context(|| format!("{} names no program interpreter", binary.display()))?;
    let loader_name = Path::new(&interpreter)
        .file_name()
        .context("the interpreter has a file name")?;
    found.push((
        PathBuf::from(&interpreter),
        Path::new(host_dir).join(loader_name),
    ));
    let mut pending = vec![binary.to_owned()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(file) = pending.pop() {
        for line in readelf(&["-d"], &file)?.lines() {
            // " 0x0000000000000001 (NEEDED)  Shared library: [libc.so.6]"
            let Some((_, rest)) = line.split_once("(NEEDED)") else {
                continue;
            };
            let name = rest
                .split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .map(|(n, _)| n.to_owned())
                .with_context(|| format!("readelf -d {}: {line}", file.display()))?;
            if !seen.insert(name.clone()) {
                continue;
            }
            let host = Path::new(host_dir).join(&name);
            if !host.is_file() {
                bail!(
                    "{} needs {name}, which is not in {host_dir} (install libc6-dev-arm64-cross: \
                     cargo xtask setup --for arm64)",
                    file.display()
                );
            }
            let host = fs::canonicalize(&host)?;
            found.push((Path::new(image_dir).join(&name), host.clone()));
            pending.push(host);
        }
    }
    for (_, file) in &found {
        if elf_machine(file)? != arch.elf_machine() {
            bail!("{} is not for {}", file.display(), arch.oci_name());
        }
    }
    Ok(found)
}

fn readelf(args: &[&str], file: &Path) -> anyhow::Result<String> {
    let out = Command::new("readelf")
        .args(["-W"])
        .args(args)
        .arg(file)
        .output()
        .context("running readelf (binutils)")?;
    if !out.status.success() {
        bail!(
            "readelf {args:?} {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Copies every shared object the `executables` load (the dynamic loader included) into
/// `rootfs` at the path it has on this machine: what an image of the machine's own binaries
/// needs.
pub fn copy_linked_libraries(rootfs: &Path, executables: &[PathBuf]) -> anyhow::Result<()> {
    let mut libraries = Vec::new();
    for executable in executables {
        libraries.extend(linked_libraries(executable)?);
    }
    libraries.sort();
    libraries.dedup();
    for library in libraries {
        let inside = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        fs::create_dir_all(inside.parent().context("in a directory")?)?;
        fs::copy(&library, &inside).with_context(|| format!("copying {}", library.display()))?;
    }
    Ok(())
}

/// The absolute paths of the shared objects `binary` loads, the dynamic loader included.
pub fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("running ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !text.contains("not a dynamic executable") {
        bail!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
