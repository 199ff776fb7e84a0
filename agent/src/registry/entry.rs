//! A registry record and its datapath entry, both ways: [`datapath_entry`] is what the
//! programs enforce for a record, [`record_from_entry`] the record a bare entry stands for when
//! the journal is gone, and [`merge`] the recovery of a journal against the pinned maps.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::{
    AddrEntry, AddrKey, AddrState, FLAG_OBSERVE_NAMESPACE, FLAG_OBSERVE_ONLY, NO_IFINDEX,
};
use log::warn;

use super::settings::RegistrySettings;
use super::types::{AddrRecord, AddrStatus, Holder, MonoNs};
use crate::datapath::strict;

/// A holder whose interface ipq cannot know any more (rebuilt from a bare datapath entry).
const UNKNOWN_IFINDEX: u32 = u32::MAX;

/// The datapath entry that mirrors `record`.
pub fn datapath_entry(record: &AddrRecord) -> AddrEntry {
    let (state, holder_ifindex) = match &record.status {
        AddrStatus::Active { holder, .. } => (AddrState::Active, holder.ifindex),
        AddrStatus::Draining { holder, .. } => (AddrState::Draining, holder.ifindex),
        AddrStatus::Quarantined { .. } => (AddrState::Quarantined, NO_IFINDEX),
    };
    let mut entry = AddrEntry::new(state, holder_ifindex, record.status.since())
        .with_fenced(record.fenced_ifindex());
    if record.observe_only {
        entry.flags |= FLAG_OBSERVE_ONLY;
    }
    if record.namespace_observed {
        entry.flags |= FLAG_OBSERVE_NAMESPACE;
    }
    entry
}

/// The journal's records merged with the entries the pinned maps hold (`entries`): the
/// merged records, the addresses where the maps changed what the journal said, and one line
/// per address where the two disagreed.
///
/// Where an entry disagrees with the journal, the stricter of the two wins
/// ([`crate::datapath::strict`]: fenced over unfenced, quarantined over free): the maps are
/// written before the journal, so an agent killed between the two writes left the newer
/// truth in the maps, but any process holding a pin may also have written them (unfencing an
/// address), so a map that enforces less is never adopted over the journal. On a tie the
/// journal's record stays. A journal record the maps lack is kept: maps are lost on reboot,
/// and a quarantine must not be. `names` names the node's interfaces now.
pub fn merge(
    journal: Vec<AddrRecord>,
    entries: Vec<(AddrKey, AddrEntry)>,
    now: MonoNs,
    settings: &RegistrySettings,
    names: &BTreeMap<u32, String>,
) -> (Vec<AddrRecord>, Vec<IpAddr>, Vec<String>) {
    let mut records: BTreeMap<IpAddr, AddrRecord> = journal
        .into_iter()
        .map(|r| (r.addr.to_canonical(), r))
        .collect();
    let mut adopted = Vec::new();
    let mut disagreeing = Vec::new();
    for (key, entry) in entries {
        let addr = key.to_ip();
        let known = records.get(&addr);
        if let Some(known) = known.filter(|r| datapath_entry(r).enforces_as(&entry)) {
            // The journal agrees; an observe-only flag only the map has (a journal written
            // before records carried it) is kept: observation never becomes enforcement.
            if entry.flags & FLAG_OBSERVE_ONLY != 0 && !known.observe_only {
                if let Some(record) = records.get_mut(&addr) {
                    record.observe_only = true;
                    adopted.push(addr);
                }
            }
            continue;
        }
        let journal_entry = known.map(datapath_entry);
        if let Some(journal_entry) = &journal_entry {
            if !strict::stricter(Some(&entry), Some(journal_entry)) {
                let line = format!(
                    "{addr}: the pinned maps hold {}, the journal {}: kept the journal's \
                     (the maps' enforces no more; another process may have written them)",
                    strict::describe(Some(&entry)),
                    strict::describe(Some(journal_entry))
                );
                warn!("{line}");
                disagreeing.push(line);
                continue;
            }
        }
        if let Some(mut record) = record_from_entry(addr, &entry, now, settings, names) {
            if let Some(known) = known {
                keep_identities(&mut record, known);
                record.observe_only |= known.observe_only;
                let line = format!(
                    "{addr}: the pinned maps hold {}, the journal {}: adopted the maps' \
                     (stricter)",
                    strict::describe(Some(&entry)),
                    strict::describe(journal_entry.as_ref())
                );
                warn!("{line}");
                disagreeing.push(line);
            }
            records.insert(addr, record);
            adopted.push(addr);
        }
    }
    (records.into_values().collect(), adopted, disagreeing)
}

/// Gives `adopted` the identities (container, pod, names) `known` had for the same interfaces.
fn keep_identities(adopted: &mut AddrRecord, known: &AddrRecord) {
    let known_holders: Vec<Holder> = known
        .status
        .holder()
        .into_iter()
        .chain(known.fenced())
        .chain(known.blocked_claimant())
        .chain(known.displaced().iter())
        .cloned()
        .collect();
    let restore = |h: &mut Holder| {
        if let Some(k) = known_holders.iter().find(|k| k.ifindex == h.ifindex) {
            *h = k.clone();
        }
    };
    match &mut adopted.status {
        AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => restore(holder),
        AddrStatus::Quarantined { .. } => {}
    }
    if let Some(fenced) = adopted.contest.fenced_mut() {
        restore(fenced);
    }
}

/// A registry record for a bare datapath entry: all that is left when the journal is gone.
/// The entry's observe-only flag is the registry's own (it derives the flag from its record),
/// so it comes back with the record.
pub fn record_from_entry(
    addr: IpAddr,
    entry: &AddrEntry,
    now: u64,
    settings: &RegistrySettings,
    names: &BTreeMap<u32, String>,
) -> Option<AddrRecord> {
    let since = entry.since_ns.min(now);
    let holder = |ifindex: u32| {
        let name = names
            .get(&ifindex)
            .cloned()
            .unwrap_or_else(|| format!("if{ifindex}"));
        Holder::new(ifindex, name)
    };
    // A holder fenced on its own address is a Draining holder another machine claimed it from.
    let fenced = (entry.fenced_ifindex != NO_IFINDEX).then(|| holder(entry.fenced_ifindex));
    let status = match entry.state()? {
        AddrState::Active if entry.holder_ifindex != NO_IFINDEX => AddrStatus::Active {
            holder: holder(entry.holder_ifindex),
            since,
        },
        AddrState::Draining if entry.holder_ifindex != NO_IFINDEX => AddrStatus::Draining {
            holder: holder(entry.holder_ifindex),
            since,
        },
        AddrState::Quarantined => {
            let last_stale = (entry.last_stale_ns != 0).then_some(entry.last_stale_ns.min(now));
            AddrStatus::Quarantined {
                since,
                until: settings.release_at(since, last_stale),
                last_stale,
                previous: Holder::new(UNKNOWN_IFINDEX, "unknown (rebuilt from the datapath)"),
            }
        }
        _ => return None,
    };
    let mut record = AddrRecord::new(addr, status);
    record.contest.set_fenced(fenced);
    record.observe_only = entry.flags & FLAG_OBSERVE_ONLY != 0;
    Some(record)
}

#[cfg(test)]
mod tests;
