//! The nightly toolchain the kernel crate is built, linked and linted with: pinned in one place,
//! `ebpf/rust-toolchain.toml`, which `agent/build.rs` reads too. Every nightly command xtask
//! starts names this toolchain, never the moving `nightly` channel, whose LLVM may no longer be
//! the one bpf-linker was built for.

use std::fs;
use std::sync::OnceLock;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::util;

/// The pin's path below the workspace root.
pub const PIN_FILE: &str = "ebpf/rust-toolchain.toml";

#[derive(Deserialize)]
struct PinFile {
    toolchain: Pin,
}

#[derive(Deserialize)]
struct Pin {
    channel: String,
}

/// The pinned nightly, e.g. `nightly-2026-05-20`, read once.
pub fn pinned_nightly() -> Result<&'static str> {
    static PINNED: OnceLock<String> = OnceLock::new();
    if let Some(channel) = PINNED.get() {
        return Ok(channel);
    }
    let path = util::workspace_root().join(PIN_FILE);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let channel = parse_channel(&text).with_context(|| {
        format!(
            "{} has no `[toolchain] channel = \"nightly-YYYY-MM-DD\"`",
            path.display()
        )
    })?;
    Ok(PINNED.get_or_init(|| channel))
}

fn parse_channel(text: &str) -> Result<String> {
    let pin: PinFile = toml::from_str(text)?;
    let channel = pin.toolchain.channel;
    // A dated nightly: the moving `nightly` is exactly what the pin is there to avoid.
    let dated = channel
        .strip_prefix("nightly-")
        .is_some_and(|date| date.len() == 10 && date.bytes().filter(|b| *b == b'-').count() == 2);
    anyhow::ensure!(
        dated,
        "`{channel}` is not a dated nightly (nightly-YYYY-MM-DD)"
    );
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_pin_is_a_dated_nightly() {
        let channel = pinned_nightly().unwrap();
        assert!(channel.starts_with("nightly-20"), "{channel}");
    }

    #[test]
    fn an_undated_nightly_is_refused() {
        let err = parse_channel("[toolchain]\nchannel = \"nightly\"\n").unwrap_err();
        assert!(err.to_string().contains("not a dated nightly"), "{err}");
    }
}
