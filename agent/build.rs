//! Builds the kernel programs of `ebpf/` for the bpf target into `OUT_DIR`, where
//! `datapath::object` embeds them, with the nightly pinned in `ebpf/rust-toolchain.toml` (the
//! one bpf-linker was built against). `cargo xtask setup` provides what this needs (that
//! nightly with its `rust-src`, and `bpf-linker`); run it first on a new machine.

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let ebpf_dir = std::path::Path::new(&manifest_dir).join("../ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .context("the path of the ebpf crate is not UTF-8")?;
    let pin_file = std::path::Path::new(&manifest_dir).join("../ebpf/rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", pin_file.display());
    let toolchain = pinned_nightly(&pin_file)?;
    // One object for every architecture the agent is built for. aya-build passes
    // `--cfg bpf_target_arch` from the target's architecture, which selects aya-ebpf's bindings
    // for kprobe registers: ipq uses none of them (its raw tracepoint reads x86-64's registers
    // by offset, and the agent attaches it on x86-64 only), so the arch changes nothing but
    // the names in the debug info. Pinned, so that the aarch64 agent embeds the same bytes as
    // the x86-64 one (`cargo xtask build --arch arm64` checks it).
    std::env::set_var("CARGO_CFG_TARGET_ARCH", "x86_64");
    // Twice: with `fetch-barriers` (its binary `ipq-fetch-barriers` is the object for weakly
    // ordered CPUs) and then without (the object `ipq`, which the first build also wrote with
    // the barriers in and this one writes again without them).
    aya_build::build_ebpf(
        [
            aya_build::Package {
                name: "ipq-ebpf",
                root_dir: ebpf_dir,
                features: &["fetch-barriers"],
                ..Default::default()
            },
            aya_build::Package {
                name: "ipq-ebpf",
                root_dir: ebpf_dir,
                ..Default::default()
            },
        ],
        aya_build::Toolchain::Custom(&toolchain),
    )
    .with_context(|| {
        format!(
            "building the eBPF object with {toolchain} failed: run `cargo xtask setup --for build` \
             ({toolchain} with rust-src, bpf-linker)"
        )
    })
}

/// `[toolchain] channel` of the pin file.
fn pinned_nightly(pin_file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(pin_file)
        .with_context(|| format!("cannot read {}", pin_file.display()))?;
    let pin: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", pin_file.display()))?;
    pin.get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(|c| c.as_str())
        .map(str::to_string)
        .with_context(|| format!("{} has no [toolchain] channel", pin_file.display()))
}
