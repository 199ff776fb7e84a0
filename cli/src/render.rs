//! The tables `ipq` prints for people. Every function takes `now`, so what "12s ago" means is
//! the caller's choice and tests are deterministic.

use std::time::SystemTime;

use super::{
    reltime::{absolute_and_relative, relative},
    table::{key_values, Table},
};
use ipq_api::{
    model::{AddressView, ConflictView, Event, EventBody, HygieneView, PendingWriteView},
    ConntrackFlush, DriftFoundBy, HoldRelease, Holder, Protection,
};

mod status;

pub use status::status;

const NONE: &str = "-";

/// How many characters of a container id identify it (as `docker ps` shows them).
const SHORT_ID: usize = 12;

/// A holder in one cell: the interface plus the pod (`ns/name`), else a short container id.
pub fn holder_short(holder: &Holder) -> String {
    if let Some(pod) = holder.pod() {
        format!("{} {}/{}", holder.ifname, pod.namespace, pod.name)
    } else if let Some(id) = holder.container_id() {
        format!("{} {}", holder.ifname, id.get(..SHORT_ID).unwrap_or(id))
    } else {
        holder.ifname.clone()
    }
}

fn holder_cell(holder: Option<&Holder>) -> String {
    holder.map_or_else(|| NONE.to_owned(), holder_short)
}

/// `ipq list` (and the addresses a drain or release changed): one address per line. A
/// quarantined address has no live holder, so the one before it shows, marked `was`; the
/// FENCED column appears only when some address has a fenced holder.
pub fn addresses(views: &[AddressView], now: SystemTime) -> String {
    let any_fenced = views.iter().any(|v| v.fenced.is_some());
    // Shown only when some holder's interface is not protected: the usual table stays narrow.
    let any_unprotected = views
        .iter()
        .any(|v| v.protection.is_some_and(|p| !p.is_protected()));
    let any_held = views.iter().any(|v| v.ipam_hold.is_some());
    let mut header = vec!["ADDRESS", "STATE", "HOLDER", "SINCE", "UNTIL", "CONFLICTS"];
    if any_fenced {
        header.push("FENCED");
    }
    if any_held {
        header.push("IPAM");
    }
    if any_unprotected {
        header.push("PROTECTION");
    }
    let mut table = Table::new(header);
    for view in views {
        let holder = match (&view.holder, &view.previous_holder) {
            (Some(live), _) => holder_short(live),
            (None, Some(previous)) => format!("was {}", holder_short(previous)),
            (None, None) => NONE.to_owned(),
        };
        let mut row = vec![
            view.address.to_string(),
            view.state.to_string(),
            holder,
            relative(&view.since, now),
            view.until
                .as_deref()
                .map_or_else(|| NONE.to_owned(), |t| relative(t, now)),
            view.conflicts.to_string(),
        ];
        if any_fenced {
            row.push(holder_cell(view.fenced.as_ref()));
        }
        if any_held {
            row.push(
                view.ipam_hold
                    .as_ref()
                    .map_or_else(|| NONE.to_owned(), |h| format!("held ({})", h.release)),
            );
        }
        if any_unprotected {
            row.push(view.protection.map_or(NONE, Protection::into).to_owned());
        }
        table.row(row);
    }
    table.render("")
}

/// A datapath write the kernel refused: what, how often, since when, why.
pub fn pending_write(pending: &PendingWriteView, now: SystemTime) -> String {
    format!(
        "{} refused {} times since {} ({}); retried every tick",
        pending.op,
        pending.failures,
        absolute_and_relative(&pending.since, now),
        pending.error
    )
}

/// `ipq get`: every field of one address, holders expanded.
pub fn address_detail(view: &AddressView, now: SystemTime) -> String {
    let time = |t: &Option<String>| {
        t.as_deref()
            .map_or_else(|| NONE.to_owned(), |t| absolute_and_relative(t, now))
    };
    let mut pairs = vec![
        ("Address".to_owned(), view.address.to_string()),
        ("State".to_owned(), view.state.to_string()),
        ("Since".to_owned(), absolute_and_relative(&view.since, now)),
        ("Until".to_owned(), time(&view.until)),
        ("Last stale".to_owned(), time(&view.last_stale)),
        ("Conflicts".to_owned(), view.conflicts.to_string()),
    ];
    if let Some(protection) = &view.protection {
        let text = match &view.attachment {
            Some(attachment) => format!("{protection} ({attachment})"),
            None => protection.to_string(),
        };
        pairs.push(("Protection".to_owned(), text));
    }
    if let Some(pending) = &view.pending_write {
        pairs.push((
            "Datapath".to_owned(),
            format!("NOT WRITTEN: {}", pending_write(pending, now)),
        ));
    }
    if view.namespace_observed {
        pairs.push((
            "Mode".to_owned(),
            "observe: its pod's namespace is only observed (observe_namespaces / \
             enforce_namespaces); what would be dropped is counted and let through"
                .to_owned(),
        ));
    }
    if view.observe_only {
        pairs.push((
            "Observe only".to_owned(),
            "yes: an early reuse was let through (on_early_reuse = observe)".to_owned(),
        ));
    }
    if let Some(hold) = &view.ipam_hold {
        let when = match (hold.release, &view.until) {
            (HoldRelease::AfterQuarantine, Some(until)) => {
                format!(
                    "after the quarantine, {}",
                    absolute_and_relative(until, now)
                )
            }
            (release, _) => release.to_string(),
        };
        pairs.push((
            "Held by IPAM".to_owned(),
            format!(
                "network {}, container {} ({}); released {when}{}",
                hold.network,
                hold.container_id,
                hold.ifname,
                hold.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        ));
    }
    hygiene_fields(&mut pairs, view.last_flush.as_ref(), now);
    holder_fields(&mut pairs, "Holder", view.holder.as_ref());
    holder_fields(&mut pairs, "Previous holder", view.previous_holder.as_ref());
    holder_fields(&mut pairs, "Fenced", view.fenced.as_ref());
    holder_fields(
        &mut pairs,
        "Blocked claimant",
        view.blocked_claimant.as_ref(),
    );
    if view.displaced.is_empty() {
        holder_fields(&mut pairs, "Displaced", None);
    }
    for displaced in &view.displaced {
        holder_fields(&mut pairs, "Displaced", Some(displaced));
    }
    key_values(&pairs)
}

/// `Last flush: <when> (<trigger>)` and, indented below, what it flushed and what failed.
fn hygiene_fields(pairs: &mut Vec<(String, String)>, flush: Option<&HygieneView>, now: SystemTime) {
    let Some(f) = flush else {
        pairs.push(("Last flush".to_owned(), NONE.to_owned()));
        return;
    };
    let when = if f.at.is_empty() {
        "still running".to_owned()
    } else {
        absolute_and_relative(&f.at, now)
    };
    pairs.push(("Last flush".to_owned(), format!("{when} ({})", f.trigger)));
    let mut sub = |key: &str, value: String| pairs.push((format!("  {key}"), value));
    sub("Conntrack entries", conntrack_count(f));
    sub("Neighbour entries", f.neighbours.to_string());
    sub(
        "Announcements",
        match &f.announce_skipped {
            Some(why) => format!("{}; {why}", f.announcements),
            None => f.announcements.to_string(),
        },
    );
    if let Some(skipped) = &f.skipped {
        sub("Skipped", skipped.clone());
    }
    for entry in &f.permanent_neighbours {
        sub("Permanent neighbour", format!("{entry} (left alone)"));
    }
    for error in &f.errors {
        sub("Failed", error.clone());
    }
}

/// The conntrack count and, for the kernel's filtered flush, what it means.
fn conntrack_count(f: &HygieneView) -> String {
    match f.conntrack_flush {
        Some(ConntrackFlush::Kernel) => format!(
            "{} (reported by the kernel's filtered flush: a lower bound)",
            f.conntrack_entries
        ),
        _ => f.conntrack_entries.to_string(),
    }
}

/// `hygiene 10.0.0.5 new_holder: 3 conntrack entries, 1 neighbours, 2 announcements`.
fn hygiene_line(f: &HygieneView) -> String {
    let mut line = format!(
        "hygiene {} {}: {} conntrack entries, {} neighbours, {} announcements",
        f.address, f.trigger, f.conntrack_entries, f.neighbours, f.announcements
    );
    if let Some(why) = &f.announce_skipped {
        line.push_str(&format!(" (announcement {why})"));
    }
    if let Some(skipped) = &f.skipped {
        line.push_str(&format!(" (skipped: {skipped})"));
    }
    if !f.errors.is_empty() {
        line.push_str(&format!("; FAILED: {}", f.errors.join("; ")));
    }
    line
}

/// `label: ifname (ifindex N)` and, indented below, each identity field the holder has.
fn holder_fields(pairs: &mut Vec<(String, String)>, label: &str, holder: Option<&Holder>) {
    let Some(h) = holder else {
        pairs.push((label.to_owned(), NONE.to_owned()));
        return;
    };
    pairs.push((
        label.to_owned(),
        format!("{} (ifindex {})", h.ifname, h.ifindex),
    ));
    let mut sub = |key: &str, value: String| pairs.push((format!("  {key}"), value));
    if let Some(id) = h.container_id() {
        sub("Container", id.to_owned());
    }
    if let Some(ifname) = h.cni_ifname() {
        sub("CNI ifname", ifname.to_owned());
    }
    if let Some(netns) = h.netns() {
        sub("Netns", netns.to_owned());
    }
    if let Some(pod) = h.pod() {
        let uid = pod
            .uid
            .as_deref()
            .map(|u| format!(" (uid {u})"))
            .unwrap_or_default();
        sub("Pod", format!("{}/{}{uid}", pod.namespace, pod.name));
    }
}

/// `ipq conflicts`: one conflict per line, oldest first.
pub fn conflicts(list: &[ConflictView], now: SystemTime) -> String {
    let mut table = Table::new([
        "AT",
        "KIND",
        "ADDRESS",
        "OLD HOLDER",
        "NEW HOLDER",
        "POLICY",
        "OUTCOME",
    ]);
    for c in list {
        table.row(vec![
            relative(&c.at, now),
            c.kind.to_string(),
            c.address.to_string(),
            holder_cell(c.old_holder.as_ref()),
            holder_cell(c.new_holder.as_ref()),
            c.policy.to_string(),
            c.outcome.to_string(),
        ]);
    }
    table.render("")
}

/// `ipq events`: one line per event, with its absolute time (a log is read later).
pub fn event_line(event: &Event) -> String {
    let what = match &event.body {
        EventBody::Transition {
            address,
            from,
            to,
            holder,
        } => {
            let by = holder
                .as_ref()
                .map(|h| format!(" holder {}", holder_short(h)))
                .unwrap_or_default();
            format!("transition {address} {from} -> {to}{by}")
        }
        EventBody::Conflict(c) => format!(
            "conflict {} {} old {} new {} policy {} outcome {}",
            c.kind,
            c.address,
            holder_cell(c.old_holder.as_ref()),
            holder_cell(c.new_holder.as_ref()),
            c.policy,
            c.outcome
        ),
        EventBody::Sample {
            address,
            hook,
            reason,
            action,
            state,
            ifindex,
            seen_on,
            holder_ifindex,
            holder,
            src_mac,
            pkt_len,
        } => format!(
            "sample {address} {action} at {hook} reason {reason} state {state} \
             on {} holder {} from {src_mac} {pkt_len} bytes",
            if seen_on.is_empty() {
                format!("ifindex {ifindex}")
            } else {
                seen_on.clone()
            },
            holder.as_ref().map_or_else(
                || format!("ifindex {holder_ifindex}"),
                |h| holder_cell(Some(h))
            ),
        ),
        EventBody::Hygiene(f) => hygiene_line(f),
        EventBody::Lost { n } => format!("lost {n} events"),
        EventBody::AttachmentLost {
            interface,
            hook,
            what,
            repaired,
            error,
            ..
        } => format!(
            "LOST {interface} {hook}: another tool took ipq's program off ({what}); {}",
            match (repaired, error) {
                (true, _) => "attached again".to_owned(),
                (false, Some(e)) => format!("NOT PROTECTED: {e}"),
                (false, None) => "NOT PROTECTED".to_owned(),
            }
        ),
        EventBody::MapRewritten {
            map,
            key,
            found,
            wanted,
            repaired,
            error,
            found_by,
        } => format!(
            "TAMPERED {map} {key}: held {found}, ipq wrote {wanted}; {}{}",
            match (repaired, error) {
                (true, _) => "written back".to_owned(),
                (false, Some(e)) => format!("NOT WRITTEN BACK: {e}"),
                (false, None) => "NOT WRITTEN BACK".to_owned(),
            },
            match found_by {
                Some(DriftFoundBy::ReportedWrite) => " (the write was reported as it happened)",
                Some(DriftFoundBy::Comparison) => " (found by comparing the maps)",
                Some(DriftFoundBy::Unknown) | None => "",
            }
        ),
        EventBody::IpamExhausted {
            network,
            container_id,
            answer,
        } => format!(
            "ipam exhausted {network:?} (ADD of {container_id}): {} quarantined, {} draining \
             held; {} {}",
            answer.quarantined,
            answer.draining,
            answer.policy,
            if answer.released.is_empty() {
                format!(
                    "-> wait{}",
                    answer
                        .next_release
                        .as_deref()
                        .map_or_else(String::new, |at| format!(" until {at}"))
                )
            } else {
                format!("-> released {:?}", answer.released)
            }
        ),
    };
    format!("{} #{} {what}", event.at, event.seq)
}
