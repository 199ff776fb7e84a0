//! Builds the kernel programs of `ebpf/` for the bpf target into `OUT_DIR`, where
//! `datapath::object` embeds them. `cargo xtask setup` provides what this needs (the nightly
//! `rust-src` and `bpf-linker`); run it first on a new machine.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir).join("../ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .context("the path of the ebpf crate is not UTF-8")?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "ipq-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context(
        "building the eBPF object failed: run `cargo xtask setup` (nightly rust-src, bpf-linker)",
    )
}
