//! Opening the table over maps an earlier agent left: `IPQ_ADDRS` and its copy `IPQ_SLOTS`
//! may disagree (an agent killed mid-write, an older agent that wrote only the hash map, or
//! another process that wrote one of them). Nothing says which copy is the truth, so per
//! address the stricter one is kept ([`crate::datapath::strict`]): a tampered map that
//! unfenced or freed an address loosens nothing before the registry (and its journal) decide.
//! A tie keeps `IPQ_ADDRS`, the copy earlier agents wrote first.

use std::collections::BTreeMap;

use ipq_common::addr::{AddrEntry, AddrKey};
use log::warn;

use crate::datapath::{
    maps::AddrMap,
    slots::SlotTable,
    strict::{describe, stricter},
    DatapathError,
};

/// Addresses named one by one in the WARN line; the rest are counted.
const NAMED: usize = 8;

/// Makes `entries` (read from `addrs`) the stricter of each address's two copies, writing
/// `IPQ_ADDRS` where the copy was stricter (`IPQ_SLOTS` is rewritten from `entries` after).
/// Returns one line per address where the two disagreed.
pub(super) fn keep_stricter(
    addrs: &mut AddrMap,
    copy: &SlotTable,
    entries: &mut BTreeMap<AddrKey, AddrEntry>,
) -> Result<Vec<String>, DatapathError> {
    let mut lines = Vec::new();
    let copied: BTreeMap<AddrKey, AddrEntry> = copy.iter().collect();
    for (addr, slot) in &copied {
        let hashed = entries.get(addr);
        if hashed.is_some_and(|h| h.enforces_as(slot)) {
            continue;
        }
        if stricter(Some(slot), hashed) {
            lines.push(format!(
                "{}: IPQ_SLOTS has {}, IPQ_ADDRS {}: kept IPQ_SLOTS's (stricter)",
                addr.to_ip(),
                describe(Some(slot)),
                describe(hashed)
            ));
            addrs.insert(addr, slot)?;
            entries.insert(*addr, *slot);
        } else {
            lines.push(format!(
                "{}: IPQ_SLOTS has {}, IPQ_ADDRS {}: kept IPQ_ADDRS's",
                addr.to_ip(),
                describe(Some(slot)),
                describe(hashed)
            ));
        }
    }
    for (addr, hashed) in entries.iter() {
        if !copied.contains_key(addr) && copy.len() > 0 {
            lines.push(format!(
                "{}: IPQ_SLOTS has no entry, IPQ_ADDRS {}: kept IPQ_ADDRS's",
                addr.to_ip(),
                describe(Some(hashed))
            ));
        }
    }
    if !lines.is_empty() {
        warn!(
            "the pinned IPQ_ADDRS and IPQ_SLOTS disagree about {} addresses (an agent killed \
             mid-write, an older agent, or another process writing them); the stricter copy \
             of each is kept until the journal is merged: {}{}",
            lines.len(),
            lines[..lines.len().min(NAMED)].join("; "),
            if lines.len() > NAMED { "; ..." } else { "" }
        );
    }
    Ok(lines)
}
