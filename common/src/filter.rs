//! The `IPQ_QFILTER` bitmap that keeps the uplink's pass path free of hash lookups.
//!
//! Every packet an uplink receives must be checked against the quarantined addresses, and almost
//! none is quarantined. The agent sets one bit per quarantined address in a 64 Ki-bit array
//! (8 KiB, one cache-friendly array lookup, inlined by the verifier); the XDP program consults
//! the hash map only when the bit of a packet's destination is set. False positives cost one
//! hash lookup, never a wrong verdict.

use crate::addr::AddrKey;

/// Words of the bitmap (each 64 bits): 65536 bits in all.
pub const FILTER_WORDS: u32 = 1024;
/// Bits in the bitmap.
pub const FILTER_BITS: u32 = FILTER_WORDS * 64;

/// The bit of an address: a multiplicative hash of its folded words. Both sides run this exact
/// function over the same memory, so they agree on every host.
#[inline(always)]
pub const fn filter_bit(addr: &AddrKey) -> u32 {
    let folded = addr.words[0]
        ^ addr.words[1].rotate_left(7)
        ^ addr.words[2].rotate_left(13)
        ^ addr.words[3];
    folded.wrapping_mul(0x9E37_79B1) >> 16
}

/// (word index, bit mask) of an address in the bitmap.
#[inline(always)]
pub const fn filter_position(addr: &AddrKey) -> (u32, u64) {
    let bit = filter_bit(addr);
    (bit / 64, 1u64 << (bit % 64))
}
