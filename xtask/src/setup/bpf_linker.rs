//! The bpf-linker the kernel crate links with: found on PATH or in cargo's bin directory,
//! else installed with cargo against the nightly toolchain's own LLVM.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::Outcome;
use crate::util::{self, nightly};

pub(super) fn bpf_linker() -> Result<Outcome> {
    if find_bpf_linker().is_some() {
        return Ok(Outcome::Present);
    }
    install_bpf_linker()?;
    if find_bpf_linker().is_none() {
        bail!(
            "`cargo install bpf-linker` succeeded but `rustup run <pinned nightly> bpf-linker --version` \
             still fails; check that {} is on PATH and run that command to see why",
            cargo_bin_dir().display()
        );
    }
    Ok(Outcome::Installed)
}

/// Finds a `bpf-linker` that runs, on PATH or in cargo's bin directory. It is run the way the
/// eBPF build runs it: aya-build builds with `rustup run <pinned nightly> cargo`, so the linker runs with
/// nightly's `lib` on LD_LIBRARY_PATH (a bpf-linker linked to nightly's LLVM needs that, and
/// stops running when nightly's LLVM changes; setup then rebuilds it). When it is only in cargo's
/// bin directory, that directory is put on this process's PATH, so that the builds xtask starts
/// (which invoke `bpf-linker` by name) find it too.
fn find_bpf_linker() -> Option<PathBuf> {
    let candidates = which::which("bpf-linker")
        .ok()
        .into_iter()
        .chain([cargo_bin_dir().join("bpf-linker")]);
    for path in candidates {
        let runs = nightly(&path, ["--version"])
            .and_then(|mut c| util::probe(&mut c))
            .is_ok_and(|o| o.status.success());
        if runs {
            if which::which("bpf-linker").ok().as_ref() != Some(&path) {
                prepend_to_path(path.parent()?);
            }
            return Some(path);
        }
    }
    None
}

/// Builds bpf-linker against the nightly toolchain's own LLVM (no system LLVM needed): cargo
/// install with `LLVM_PREFIX` pointing at a directory whose `lib/libLLVM.so` links to the
/// toolchain's `libLLVM.so.*`, and the `llvm-<major>` feature matching that LLVM.
fn install_bpf_linker() -> Result<()> {
    let sysroot = util::output(&mut nightly("rustc", ["--print", "sysroot"])?)
        .context("cannot find the nightly toolchain's sysroot")?;
    let sysroot_lib = Path::new(sysroot.trim()).join("lib");
    let version = util::output(&mut nightly("rustc", ["-vV"])?)?;
    let major = llvm_major(&version).with_context(|| {
        format!("cannot read the LLVM version from `rustc +nightly -vV`:\n{version}")
    })?;
    let libllvm = find_libllvm(&sysroot_lib)?;

    let prefix = util::workspace_root().join("target/xtask/llvm-prefix");
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("cannot create {}", lib.display()))?;
    // `lib/libLLVM.so` is what the build links against. The second link, under the library's
    // own name, lets the installed binary (whose RUNPATH is this `lib`) also run outside
    // `rustup run nightly`, for as long as this directory exists.
    let soname = libllvm.file_name().context("libLLVM has a file name")?;
    for link in [lib.join("libLLVM.so"), lib.join(soname)] {
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&libllvm, &link)
            .with_context(|| format!("cannot link {} -> {}", link.display(), libllvm.display()))?;
    }

    let features = format!("llvm-{major}");
    // --force: a bpf-linker that no longer runs (built against an older nightly's LLVM) is
    // still "installed" as far as cargo is concerned.
    let args = [
        "install",
        "bpf-linker",
        "--force",
        "--no-default-features",
        "--features",
        &features,
    ];
    util::run(nightly("cargo", args)?.env("LLVM_PREFIX", &prefix)).with_context(|| {
        format!(
            "building bpf-linker against nightly's LLVM {major} failed (see the compiler \
             output above); check network access to crates.io, or install a bpf-linker built \
             for LLVM {major} on PATH by hand"
        )
    })
}

/// `LLVM version: 22.1.4` -> 22.
fn llvm_major(rustc_vv: &str) -> Option<u32> {
    let version = rustc_vv
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version:"))?;
    version.trim().split('.').next()?.parse().ok()
}

fn find_libllvm(sysroot_lib: &Path) -> Result<PathBuf> {
    let entries = fs::read_dir(sysroot_lib)
        .with_context(|| format!("cannot list {}", sysroot_lib.display()))?;
    for entry in entries {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("libLLVM.so.")
        {
            return Ok(entry.path());
        }
    }
    bail!(
        "no libLLVM.so.* in {}: this nightly ships no shared LLVM to build bpf-linker against; \
         install bpf-linker by hand (with an LLVM matching `rustc +nightly -vV`)",
        sysroot_lib.display()
    )
}

/// Where `cargo install` puts binaries.
fn cargo_bin_dir() -> PathBuf {
    if let Some(root) = env::var_os("CARGO_INSTALL_ROOT") {
        return PathBuf::from(root).join("bin");
    }
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"));
    cargo_home.join("bin")
}

fn prepend_to_path(dir: &Path) {
    let old = env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(env::split_paths(&old));
    if let Ok(new) = env::join_paths(dirs) {
        // Only xtask's own thread runs at this point; the children it starts inherit this.
        env::set_var("PATH", new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_from_rustc_vv() {
        let vv = "rustc 1.97.0-nightly\nbinary: rustc\nLLVM version: 22.1.4\n";
        assert_eq!(llvm_major(vv), Some(22));
        assert_eq!(llvm_major("rustc 1.97.0-nightly\n"), None);
    }
}
