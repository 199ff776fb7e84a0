//! The kernel object, built by `build.rs` (aya-build) into `OUT_DIR` and embedded in the binary:
//! the agent never looks for it on disk, so the programs always match the agent.

pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ipq"));
