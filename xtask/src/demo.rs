//! `cargo xtask demo`: not written yet.

use anyhow::{bail, Result};

pub fn run() -> Result<()> {
    bail!("demo: not yet written")
}
