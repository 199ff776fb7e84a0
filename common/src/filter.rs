//! The `IPQ_QBLOOM` filter that keeps the uplink's pass path free of hash lookups.
//!
//! Every packet an uplink receives must be checked against the quarantined addresses, and almost
//! none is quarantined. The agent keeps a blocked two-hash Bloom filter of the quarantined
//! addresses: one 64-bit word per address, chosen by one hash, with two bits set in it, chosen by
//! two more. The XDP program reads one array word (inlined by the verifier into pointer
//! arithmetic) and consults the hash map only when both bits of a packet's destination are set.
//! False positives cost one hash lookup, never a wrong verdict.
//!
//! The filter is sized from `capacity`: [`FILTER_BITS_PER_ADDRESS`] bits for every address the
//! registry can hold, so a full registry of quarantined addresses keeps false positives near
//! 0.5 % (the word-blocked estimate; under 1 % is the target). The kernel program learns the
//! size from a `.rodata` constant ([`FILTER_MASK_GLOBAL`]) the agent sets at load time.

use crate::addr::AddrKey;

/// Filter bits per address of `capacity`. A two-bit, word-blocked filter at 32 bits per address
/// has a false-positive rate of about 0.53 % when full (16 bits would give about 1.7 %).
pub const FILTER_BITS_PER_ADDRESS: u32 = 32;
/// The smallest filter, in 64-bit words (8 KiB): the size of the single-hash bitmap it replaces.
pub const FILTER_WORDS_MIN: u32 = 1024;
/// The largest filter, in words (16 MiB): capacities above 4 Mi addresses share it.
pub const FILTER_WORDS_MAX: u32 = 1 << 21;
/// Words of the filter the object declares; the agent resizes it from `capacity` at load time.
pub const FILTER_WORDS_DEFAULT: u32 = filter_words(crate::names::DEFAULT_ADDR_CAPACITY);

/// Name of the `.rodata` constant holding `words - 1` (the filter's word count is a power of
/// two), which the agent overrides at load time together with the map's size.
pub const FILTER_MASK_GLOBAL: &str = "IPQ_QBLOOM_MASK";

/// Words of the filter for a registry of `capacity` addresses: a power of two holding at least
/// [`FILTER_BITS_PER_ADDRESS`] bits per address, within the bounds above.
pub const fn filter_words(capacity: u32) -> u32 {
    let bits = (capacity as u64) * FILTER_BITS_PER_ADDRESS as u64;
    let words = bits.div_ceil(64).next_power_of_two();
    if words < FILTER_WORDS_MIN as u64 {
        FILTER_WORDS_MIN
    } else if words > FILTER_WORDS_MAX as u64 {
        FILTER_WORDS_MAX
    } else {
        words as u32
    }
}

/// Whether `words` is a filter size this build can use (a pinned filter is adopted as is).
pub const fn valid_filter_words(words: u32) -> bool {
    words.is_power_of_two() && words >= FILTER_WORDS_MIN && words <= FILTER_WORDS_MAX
}

/// A 64-bit mix of the address's four words: the keyed mix of `IPQ_SLOTS` with key 0 (the
/// filter is rebuilt by every agent, so it needs no secret; its positions must not change, as
/// an attached program of the previous agent reads them until it is replaced).
#[inline(always)]
pub const fn filter_hash(addr: &AddrKey) -> u64 {
    crate::slots::slot_hash(addr, 0)
}

/// (word index, two-bit mask) of an address in a filter of `mask + 1` words.
#[inline(always)]
pub const fn filter_position(addr: &AddrKey, mask: u32) -> (u32, u64) {
    let h = filter_hash(addr);
    let word = (h >> 32) as u32 & mask;
    let bits = (1u64 << (h & 63)) | (1u64 << ((h >> 6) & 63));
    (word, bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_those_earlier_agents_computed() {
        // Values of the hash before it was shared with `IPQ_SLOTS`: an attached program of the
        // previous agent reads the filter at these positions until it is replaced.
        let v4 = AddrKey::from_ipv4(core::net::Ipv4Addr::new(10, 20, 0, 7));
        assert_eq!(filter_hash(&v4), 0x9f1e_5b0b_a775_017a);
        let v6 = AddrKey::from_ipv6(core::net::Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 9));
        assert_eq!(filter_hash(&v6), 0x73c7_8352_790b_e9bd);
    }

    #[test]
    fn sizes_follow_capacity_in_powers_of_two() {
        assert_eq!(filter_words(1), FILTER_WORDS_MIN);
        assert_eq!(filter_words(65536), 32768);
        assert_eq!(filter_words(65537), 65536);
        assert_eq!(filter_words(u32::MAX), FILTER_WORDS_MAX);
        assert_eq!(FILTER_WORDS_DEFAULT, 32768);
        for capacity in [1, 1000, 16384, 65536, 100_000, 1 << 20] {
            let words = filter_words(capacity);
            assert!(valid_filter_words(words));
            assert!(u64::from(words) * 64 >= u64::from(capacity) * 32);
        }
        assert!(!valid_filter_words(1000));
        assert!(!valid_filter_words(512));
    }

    #[test]
    fn an_address_sets_at_most_two_bits_of_one_word() {
        let addr = AddrKey::from_ipv4(core::net::Ipv4Addr::new(10, 1, 2, 3));
        let (word, bits) = filter_position(&addr, 1023);
        assert!(word < 1024);
        assert!((1..=2).contains(&bits.count_ones()));
        assert_eq!(filter_position(&addr, 1023), (word, bits));
    }

    extern crate std;
    use core::net::{Ipv4Addr, Ipv6Addr};
    use std::vec::Vec;

    /// A filter of the size `capacity` gets, holding `members`, as the agent sets it.
    fn filled(capacity: u32, members: impl Iterator<Item = AddrKey>) -> (Vec<u64>, u32) {
        let words = filter_words(capacity);
        let mut filter = std::vec![0u64; words as usize];
        for addr in members {
            let (word, bits) = filter_position(&addr, words - 1);
            filter[word as usize] |= bits;
        }
        (filter, words - 1)
    }

    fn hits(filter: &[u64], mask: u32, probes: impl Iterator<Item = AddrKey>) -> (u32, u32) {
        let (mut hit, mut total) = (0, 0);
        for addr in probes {
            let (word, bits) = filter_position(&addr, mask);
            total += 1;
            if filter[word as usize] & bits == bits {
                hit += 1;
            }
        }
        (hit, total)
    }

    /// Issue 11: a full registry of 64k quarantined addresses from one /16 (the case that
    /// saturated the old 64 Ki-bit bitmap) keeps false positives under 1 %, for neighbours in
    /// the next /16s and for IPv6 addresses alike; and every member is found.
    #[test]
    fn a_full_registry_keeps_false_positives_under_one_percent() {
        let capacity = 65536;
        let members = (0..capacity).map(|i| AddrKey::from_ipv4(Ipv4Addr::from(0x0a14_0000 + i)));
        let (filter, mask) = filled(capacity, members.clone());
        let (found, all) = hits(&filter, mask, members);
        assert_eq!(found, all, "a member was missed: never allowed");

        let next_16s =
            (0..4 * 65536u32).map(|i| AddrKey::from_ipv4(Ipv4Addr::from(0x0a15_0000 + i)));
        let (fp, total) = hits(&filter, mask, next_16s);
        let rate = f64::from(fp) / f64::from(total);
        std::eprintln!("IPv4 false positives {fp}/{total} = {rate:.4}");
        assert!(rate < 0.01, "IPv4 false positives {fp}/{total} = {rate:.4}");

        let mut state = 0x1234_5678_9abc_def0u64;
        let random_v6 = (0..262_144).map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            AddrKey::from_ipv6(Ipv6Addr::from(u128::from(state) << 64 | 0xfd00))
        });
        let (fp, total) = hits(&filter, mask, random_v6);
        let rate = f64::from(fp) / f64::from(total);
        std::eprintln!("IPv6 false positives {fp}/{total} = {rate:.4}");
        assert!(rate < 0.01, "IPv6 false positives {fp}/{total} = {rate:.4}");
    }

    /// The same for a full registry of IPv6 pod addresses from one /64.
    #[test]
    fn a_full_ipv6_registry_keeps_false_positives_under_one_percent() {
        let capacity = 16384;
        let base: u128 = 0xfd00_0000_0000_0001_0000_0000_0000_0000;
        let members =
            (0..u128::from(capacity)).map(|i| AddrKey::from_ipv6(Ipv6Addr::from(base + i)));
        let (filter, mask) = filled(capacity, members);
        let others =
            (0..262_144u128).map(|i| AddrKey::from_ipv6(Ipv6Addr::from(base + 1_000_000 + i)));
        let (fp, total) = hits(&filter, mask, others);
        let rate = f64::from(fp) / f64::from(total);
        std::eprintln!("false positives {fp}/{total} = {rate:.4}");
        assert!(rate < 0.01, "false positives {fp}/{total} = {rate:.4}");
    }
}
