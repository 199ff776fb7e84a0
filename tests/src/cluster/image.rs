//! ipq's image for the cluster tier, made without a Docker engine: what
//! `deploy/docker/Dockerfile` ships (ipq-agent, ipq, ipq-cni, ipq-ipam from the release build,
//! in /usr/local/bin), on a minimal base of the machine's own instead of Debian's slim image:
//! Debian's static busybox for the shell, grep and mount the DaemonSet's init step runs, and
//! the shared libraries the binaries link (read with ldd), at the paths they are linked at.

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

/// The binaries the Dockerfile copies into /usr/local/bin.
pub const SHIPPED_BINARIES: [&str; 4] = ["ipq-agent", "ipq", "ipq-cni", "ipq-ipam"];

/// What the DaemonSet's steps run besides the binaries, and what a human would type in
/// `kubectl exec`.
const APPLETS: [&str; 12] = [
    "sh", "grep", "mount", "cat", "echo", "ls", "sleep", "ps", "mkdir", "rm", "test", "[",
];

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
    let rootfs = work.join("rootfs");
    let bin = rootfs.join("bin");
    let local_bin = rootfs.join("usr/local/bin");
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(&local_bin)?;
    for dir in ["proc", "sys", "dev", "etc", "tmp", "run", "var/lib"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy("/bin/busybox", bin.join("busybox"))
        .context("copying /bin/busybox (install busybox-static)")?;
    for applet in APPLETS {
        symlink("busybox", bin.join(applet))?;
    }
    let mut libraries = Vec::new();
    for name in SHIPPED_BINARIES {
        let binary = release_binary(name)?;
        fs::copy(&binary, local_bin.join(name))
            .with_context(|| format!("copying {}", binary.display()))?;
        libraries.extend(linked_libraries(&binary)?);
    }
    libraries.sort();
    libraries.dedup();
    for library in libraries {
        let inside = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        fs::create_dir_all(inside.parent().context("a library lives in a directory")?)?;
        // Copied through symlinks: the image holds the files themselves.
        fs::copy(&library, &inside).with_context(|| format!("copying {}", library.display()))?;
    }
    crate::oci::archive(
        &rootfs,
        work,
        IPQ_IMAGE,
        &["/usr/local/bin/ipq-agent"],
        &["PATH=/usr/local/bin:/bin"],
    )
}

/// The absolute paths of the shared objects `binary` loads, the dynamic loader included.
fn linked_libraries(binary: &Path) -> anyhow::Result<Vec<PathBuf>> {
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
