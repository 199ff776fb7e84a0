use which::which;

/// Building this crate for the bpf target links with bpf-linker. A new bpf-linker must rebuild the
/// object even though no source changed.
fn main() {
    let bpf_linker = which("bpf-linker").unwrap_or_default();
    println!("cargo:rerun-if-changed={}", bpf_linker.display());
}
