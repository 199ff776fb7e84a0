//! The kernel object, built by `build.rs` (aya-build) into `OUT_DIR` and embedded in the binary:
//! the agent never looks for it on disk, so the programs always match the agent.

pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ipq"));

/// The same programs with their reads of `IPQ_SLOTS` ordered by fetch-atomic barriers, for a
/// weakly ordered CPU on a kernel with fetch atomics (`ipq_common::slots::SlotsOrder`).
pub static OBJECT_FETCH_BARRIERS: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ipq-fetch-barriers"));

/// The object for `order`.
pub fn for_order(order: ipq_common::slots::SlotsOrder) -> &'static [u8] {
    match order {
        ipq_common::slots::SlotsOrder::FetchBarrier => OBJECT_FETCH_BARRIERS,
        _ => OBJECT,
    }
}
