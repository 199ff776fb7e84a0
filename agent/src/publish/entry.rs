//! One address as the NodeQuarantine object lists it, taken from its registry record on the
//! owner loop (O(1): a few fields and one holder cloned), and the object's status built from
//! all of them off that loop.

use std::{collections::BTreeMap, net::IpAddr};

use serde_json::{json, Map, Value};

use crate::{
    api::views::TimeBase,
    registry::{AddrRecord, AddrStatus, Holder, MonoNs},
};

/// What an entry says about its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum EntryState {
    /// The holder is gone; the address cools down.
    Quarantined,
    /// A live holder the address was taken from, whose traffic ipq drops.
    Fenced,
    /// A live holder whose pod was deleted while it runs (a force delete), its address freed
    /// by the cluster's IPAM (whereabouts deleted its reservation): nothing was taken from it
    /// yet, and ipq keeps the address from the next pod. Only the whereabouts projection
    /// learns of it ([`crate::publish::whereabouts`]), and lists it through [`Orphans`].
    Orphaned,
}

/// The whereabouts projection's orphaned holders by address, handed to the NodeQuarantine
/// writer whole whenever they change (they are few: force-deleted pods still running).
pub type Orphans = std::sync::Arc<BTreeMap<IpAddr, PublishedEntry>>;

/// One listed address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedEntry {
    pub state: EntryState,
    pub since: MonoNs,
    /// When the quarantine is due to end; `None` while a holder of the address still lives
    /// (a fenced, blocked or displaced one): such an entry must never end on a reader's timer.
    pub until: Option<MonoNs>,
    /// For a quarantine, the holder that went; for a fence, the fenced holder.
    pub holder: Holder,
}

impl PublishedEntry {
    /// The entry of `record`, or `None` when the object does not list it (an address held by
    /// its one live holder).
    pub fn of(record: &AddrRecord) -> Option<Self> {
        match &record.status {
            AddrStatus::Quarantined {
                since,
                until,
                previous,
                ..
            } => {
                let someone_lives = record.fenced().is_some()
                    || record.blocked_claimant().is_some()
                    || !record.displaced().is_empty();
                Some(Self {
                    state: EntryState::Quarantined,
                    since: *since,
                    until: (!someone_lives).then_some(*until),
                    holder: previous.clone(),
                })
            }
            AddrStatus::Active { since, .. } | AddrStatus::Draining { since, .. } => {
                record.fenced().map(|fenced| Self {
                    state: EntryState::Fenced,
                    since: *since,
                    until: None,
                    holder: fenced.clone(),
                })
            }
        }
    }

    /// Whether `self` is `old` with only its quarantine's end moved later (stale traffic):
    /// the one change the writer may hold back for a while.
    pub fn only_ends_later_than(&self, old: &PublishedEntry) -> bool {
        self.state == old.state
            && self.since == old.since
            && self.holder == old.holder
            && matches!((self.until, old.until), (Some(new), Some(old)) if new >= old)
    }

    /// The entry as the CRD's schema has it (deploy/kubernetes/05-nodequarantine-crd.yaml).
    pub fn to_json(&self, addr: IpAddr, time: &TimeBase) -> Value {
        let mut entry = Map::new();
        entry.insert("address".into(), json!(addr.to_string()));
        entry.insert("state".into(), json!(<&str>::from(self.state)));
        entry.insert("since".into(), json!(time.rfc3339(self.since)));
        if let Some(until) = self.until {
            entry.insert("until".into(), json!(time.rfc3339(until)));
        }
        entry.insert("holder".into(), holder_json(&self.holder));
        Value::Object(entry)
    }
}

fn holder_json(holder: &Holder) -> Value {
    let mut out = Map::new();
    if let Some(pod) = holder.pod() {
        out.insert("namespace".into(), json!(pod.namespace));
        out.insert("pod".into(), json!(pod.name));
        if let Some(uid) = &pod.uid {
            out.insert("uid".into(), json!(uid));
        }
    }
    if let Some(id) = holder.container_id() {
        out.insert("containerID".into(), json!(id));
    }
    if let Some(ifname) = holder.cni_ifname() {
        out.insert("interface".into(), json!(ifname));
    }
    if !holder.ifname.is_empty() {
        out.insert("hostInterface".into(), json!(holder.ifname));
    }
    Value::Object(out)
}

/// What one status write carries: the entries (at most `max_entries`, in address order) and
/// the counts, which cover every entry, listed or not.
pub struct StatusBody {
    pub status: Value,
    pub listed: usize,
    pub omitted: usize,
    /// Of the listed entries, the orphaned ones.
    pub orphaned: usize,
}

/// The registry's entries and the projection's orphans in address order, one entry per
/// address: the registry's wins (a quarantine or a fence says more than "its pod is gone").
fn merged<'a>(
    entries: &'a BTreeMap<IpAddr, PublishedEntry>,
    orphans: &'a BTreeMap<IpAddr, PublishedEntry>,
) -> impl Iterator<Item = (&'a IpAddr, &'a PublishedEntry)> {
    let mut ours = entries.iter().peekable();
    let mut theirs = orphans
        .iter()
        .filter(|(addr, _)| !entries.contains_key(addr))
        .peekable();
    std::iter::from_fn(move || match (ours.peek(), theirs.peek()) {
        (Some((a, _)), Some((b, _))) if b < a => theirs.next(),
        (Some(_), _) => ours.next(),
        (None, _) => theirs.next(),
    })
}

/// The object's status from every entry the publisher holds and the projection's orphans.
/// O(entries + orphans), off the owner loop.
pub fn status_body(
    node: &str,
    entries: &BTreeMap<IpAddr, PublishedEntry>,
    orphans: &BTreeMap<IpAddr, PublishedEntry>,
    max_entries: usize,
    time: &TimeBase,
    published_at: std::time::SystemTime,
) -> StatusBody {
    let (mut quarantined, mut fenced, mut orphaned, mut listed_orphans) = (0, 0, 0, 0);
    let mut listed = Vec::new();
    for (addr, entry) in merged(entries, orphans) {
        match entry.state {
            EntryState::Quarantined => quarantined += 1,
            EntryState::Fenced => fenced += 1,
            EntryState::Orphaned => orphaned += 1,
        }
        if listed.len() < max_entries {
            listed_orphans += usize::from(entry.state == EntryState::Orphaned);
            listed.push(entry.to_json(*addr, time));
        }
    }
    let omitted = quarantined + fenced + orphaned - listed.len();
    StatusBody {
        listed: listed.len(),
        omitted,
        orphaned: listed_orphans,
        status: json!({
            "nodeName": node,
            "publishedAt": humantime::format_rfc3339_millis(published_at).to_string(),
            "quarantined": quarantined,
            "fenced": fenced,
            "orphaned": orphaned,
            "omitted": omitted,
            "maxEntries": max_entries,
            "entries": listed,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::registry::PodRef;

    fn pod_holder() -> Holder {
        Holder::new(7, "veth1").with_identity(
            Some("c0ffee".into()),
            Some("eth0".into()),
            Some("net".into()),
            None,
            Some(PodRef {
                namespace: "default".into(),
                name: "web-1".into(),
                uid: Some("u-1".into()),
            }),
        )
    }

    #[test]
    fn a_quarantine_ends_at_its_deadline_only_when_nobody_lives_on_the_address() {
        let addr: IpAddr = "10.0.0.5".parse().unwrap();
        let record = AddrRecord::new(
            addr,
            AddrStatus::Quarantined {
                since: 1_000_000_000,
                until: 31_000_000_000,
                last_stale: None,
                previous: pod_holder(),
            },
        );
        let entry = PublishedEntry::of(&record).expect("a quarantine is listed");
        let time = TimeBase::at(
            0,
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        );
        let json = entry.to_json(addr, &time);
        assert_eq!(json["state"], "quarantined");
        assert_eq!(json["address"], "10.0.0.5");
        assert_eq!(json["since"], "2027-01-15T08:00:01.000Z");
        assert_eq!(json["until"], "2027-01-15T08:00:31.000Z");
        assert_eq!(
            json["holder"],
            json!({"namespace": "default", "pod": "web-1", "uid": "u-1",
                   "containerID": "c0ffee", "interface": "eth0", "hostInterface": "veth1"})
        );

        let active = AddrRecord::new(
            addr,
            AddrStatus::Active {
                holder: pod_holder(),
                since: 5,
            },
        );
        assert_eq!(
            PublishedEntry::of(&active),
            None,
            "one live holder: not listed"
        );
    }

    #[test]
    fn the_status_counts_every_entry_and_lists_at_most_the_cap() {
        let time = TimeBase::at(0, SystemTime::UNIX_EPOCH);
        let entries: BTreeMap<IpAddr, PublishedEntry> = (1..=5u8)
            .map(|i| {
                let state = if i == 5 {
                    EntryState::Fenced
                } else {
                    EntryState::Quarantined
                };
                let entry = PublishedEntry {
                    state,
                    since: 0,
                    until: None,
                    holder: Holder::new(u32::from(i), format!("veth{i}")),
                };
                (IpAddr::from([10, 0, 0, i]), entry)
            })
            .collect();
        let none = BTreeMap::new();
        let body = status_body("node-a", &entries, &none, 3, &time, SystemTime::UNIX_EPOCH);
        assert_eq!((body.listed, body.omitted), (3, 2));
        assert_eq!(body.status["quarantined"], 4);
        assert_eq!(body.status["fenced"], 1);
        assert_eq!(body.status["omitted"], 2);
        let listed: Vec<&str> = body.status["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["address"].as_str().unwrap())
            .collect();
        assert_eq!(listed, ["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        assert!(body.status["entries"][0].get("until").is_none());
    }

    #[test]
    fn orphans_are_listed_in_address_order_and_the_registrys_entry_wins_on_an_address() {
        let time = TimeBase::at(0, SystemTime::UNIX_EPOCH);
        let entry = |state, i: u8| PublishedEntry {
            state,
            since: 0,
            until: None,
            holder: Holder::new(u32::from(i), format!("veth{i}")),
        };
        let addr = |i: u8| IpAddr::from([10, 0, 0, i]);
        let entries: BTreeMap<IpAddr, PublishedEntry> = [
            (addr(2), entry(EntryState::Quarantined, 2)),
            (addr(4), entry(EntryState::Fenced, 4)),
        ]
        .into_iter()
        .collect();
        let orphans: BTreeMap<IpAddr, PublishedEntry> = [1, 3, 4, 5]
            .into_iter()
            .map(|i| (addr(i), entry(EntryState::Orphaned, i)))
            .collect();
        let body = status_body(
            "node-a",
            &entries,
            &orphans,
            10,
            &time,
            SystemTime::UNIX_EPOCH,
        );
        let listed: Vec<(String, String)> = body.status["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["address"].as_str().unwrap().into(),
                    e["state"].as_str().unwrap().into(),
                )
            })
            .collect();
        let expected: Vec<(String, String)> = [
            ("10.0.0.1", "orphaned"),
            ("10.0.0.2", "quarantined"),
            ("10.0.0.3", "orphaned"),
            ("10.0.0.4", "fenced"),
            ("10.0.0.5", "orphaned"),
        ]
        .iter()
        .map(|(a, s)| (a.to_string(), s.to_string()))
        .collect();
        assert_eq!(listed, expected);
        assert_eq!(
            (
                &body.status["quarantined"],
                &body.status["fenced"],
                &body.status["orphaned"]
            ),
            (&json!(1), &json!(1), &json!(3))
        );
        assert_eq!((body.listed, body.omitted, body.orphaned), (5, 0, 3));
        assert!(body.status["entries"][0].get("until").is_none());

        let capped = status_body(
            "node-a",
            &entries,
            &orphans,
            2,
            &time,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!((capped.listed, capped.omitted, capped.orphaned), (2, 3, 1));
        assert_eq!(
            capped.status["orphaned"], 3,
            "the counts cover what is left out"
        );
    }
}
