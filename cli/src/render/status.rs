//! `ipq status`: readiness, policy, counts, how claims flush, the last verification, and every
//! configured interface with its protection.

use std::time::SystemTime;

use ipq_api::{
    model::{PublishView, Status, WhereaboutsView},
    RecoveredFrom,
};

use super::{absolute_and_relative, key_values, Table, NONE};

/// `ipq status`.
pub fn status(status: &Status, now: SystemTime) -> String {
    let r = &status.registry;
    let ready = match (status.ready, &status.not_ready) {
        (true, _) => "yes".to_owned(),
        (false, Some(why)) => format!("no: {why}"),
        (false, None) => "no".to_owned(),
    };
    let mut pairs = vec![
        ("Ready".to_owned(), ready),
        ("Version".to_owned(), status.version.clone()),
        ("Mode".to_owned(), status.mode.as_ref().to_owned()),
        (
            "On early reuse".to_owned(),
            status.on_early_reuse.to_string(),
        ),
        (
            "Started".to_owned(),
            absolute_and_relative(&status.started_at, now),
        ),
        (
            "Registry".to_owned(),
            format!(
                "{}/{} entries: {} active, {} draining, {} quarantined",
                r.entries, r.capacity, r.active, r.draining, r.quarantined
            ),
        ),
        (
            "Conflicts".to_owned(),
            format!(
                "{} total, {} claims refused",
                status.conflicts_total, status.refused_claims_total
            ),
        ),
        (
            "Interfaces".to_owned(),
            match (status.interfaces.len(), status.unprotected) {
                (0, _) => "none attached".to_owned(),
                (n, 0) => n.to_string(),
                (n, u) => format!("{n}, {u} NOT PROTECTED"),
            },
        ),
        ("TC attach".to_owned(), status.tc_attach.to_string()),
        (
            "Conntrack".to_owned(),
            status.conntrack_claim_flush.as_ref().map_or_else(
                || NONE.to_owned(),
                |f| format!("claims flushed by: IPv4 {}; IPv6 {}", f.ipv4, f.ipv6),
            ),
        ),
        ("Verified".to_owned(), verification(status, now)),
        ("Datapath".to_owned(), datapath_writes(status, now)),
        ("Recovered".to_owned(), recovery(status)),
    ];
    if let Some(publish) = &status.publish {
        pairs.push(("NodeQuarantine".to_owned(), published(publish, now)));
    }
    if let Some(whereabouts) = &status.whereabouts {
        pairs.push(("whereabouts".to_owned(), projected(whereabouts, now)));
    }
    if let Some(scope) = namespace_scope(status) {
        pairs.push(("Namespaces".to_owned(), scope));
    }
    if let Some(cluster) = &status.cluster {
        pairs.push(("Other nodes".to_owned(), other_nodes(cluster)));
    }
    if !status.unannounced.is_empty() {
        pairs.push(("Unannounced".to_owned(), status.unannounced.clone()));
    }
    let mut out = key_values(&pairs);
    if !status.interfaces.is_empty() {
        let any_error = status.interfaces.iter().any(|i| i.error.is_some());
        let mut header = vec!["IFINDEX", "NAME", "HOOKS", "ATTACHMENT", "PROTECTION"];
        if any_error {
            header.push("ERROR");
        }
        let mut table = Table::new(header);
        for iface in &status.interfaces {
            let mut row = vec![
                iface.ifindex.to_string(),
                iface.name.clone(),
                if iface.hooks.is_empty() {
                    NONE.to_owned()
                } else {
                    iface
                        .hooks
                        .iter()
                        .map(|h| h.as_ref())
                        .collect::<Vec<_>>()
                        .join(",")
                },
                iface
                    .attachment
                    .map_or_else(|| NONE.to_owned(), |a| a.to_string()),
                if iface.protection.is_protected() && !iface.ahead.is_empty() {
                    format!("{} (co-tenant ahead hands on)", iface.protection)
                } else {
                    iface.protection.to_string()
                },
            ];
            if any_error {
                row.push(match &iface.error {
                    Some(e) => format!("{e} ({} attempts)", iface.failed_attempts),
                    None => NONE.to_owned(),
                });
            }
            table.row(row);
        }
        out.push_str(&table.render("  "));
        // What runs before ipq's program, and what it does: why an interface with a
        // co-tenant ahead is protected, bypassed or unverified.
        for iface in &status.interfaces {
            for line in &iface.ahead {
                out.push_str(&format!("  ahead of ipq on {}: {line}\n", iface.name));
            }
        }
    }
    out
}

/// Whether every datapath write went through; else how many are pending and the first ones.
fn datapath_writes(status: &Status, now: SystemTime) -> String {
    if status.datapath_writes_pending == 0 {
        return "every write through".to_owned();
    }
    let mut text = format!("{} addresses NOT WRITTEN", status.datapath_writes_pending);
    for pending in &status.pending_writes {
        text.push_str(&format!(
            "; {}: {}",
            pending.address,
            super::pending_write(pending, now)
        ));
    }
    text
}

/// Where the registry came back from at start, and what was wrong with what it found.
fn recovery(status: &Status) -> String {
    let Some(r) = &status.recovery else {
        return NONE.to_owned();
    };
    let from = match r.from {
        RecoveredFrom::Journal => "from the journal",
        RecoveredFrom::PinnedMaps => "from the pinned maps",
        RecoveredFrom::Unknown => "from a source this ipq does not know",
    };
    let mut text = format!("{from}, {} addresses", r.addresses);
    if !r.problems.is_empty() {
        text.push_str(&format!("; {}", r.problems.join("; ")));
    }
    text
}

/// When the datapath was last verified against the kernel, and what that found.
fn verification(status: &Status, now: SystemTime) -> String {
    let Some(v) = &status.verification else {
        return "not yet".to_owned();
    };
    let when = absolute_and_relative(&v.at, now);
    let took = v.took_us as f64 / 1000.0;
    if v.found.is_empty() {
        let mut text = format!("{when}, {} pins in place ({took:.1} ms)", v.pins);
        if let Some(at) = &v.last_found_at {
            text.push_str(&format!(
                "; last found {}: {}",
                absolute_and_relative(at, now),
                v.last_found.join("; ")
            ));
        }
        text
    } else {
        format!(
            "{when}, {} pins ({took:.1} ms); FOUND: {}",
            v.pins,
            v.found.join("; ")
        )
    }
}

/// Observe by namespace, when configured: which namespaces are only observed, and how many
/// addresses that covers.
fn namespace_scope(status: &Status) -> Option<String> {
    let covered = format!("{} addresses observed", status.namespace_observed);
    if !status.observe_namespaces.is_empty() {
        return Some(format!(
            "observe {}, enforce the rest; {covered}",
            status.observe_namespaces.join(", ")
        ));
    }
    if !status.enforce_namespaces.is_empty() {
        return Some(format!(
            "enforce {}, observe the rest (pods of no known namespace enforced); {covered}",
            status.enforce_namespaces.join(", ")
        ));
    }
    None
}

/// The other nodes' NodeQuarantine objects, summarized: per node its counts and newest entries.
fn other_nodes(c: &ipq_api::model::ClusterView) -> String {
    let mut parts: Vec<String> = c
        .nodes
        .iter()
        .map(|n| {
            let newest: Vec<String> = n
                .newest
                .iter()
                .map(|e| match &e.pod {
                    Some(pod) => format!("{} {} ({pod}) since {}", e.address, e.state, e.since),
                    None => format!("{} {} since {}", e.address, e.state, e.since),
                })
                .collect();
            let orphaned = if n.orphaned > 0 {
                format!(", {} orphaned", n.orphaned)
            } else {
                String::new()
            };
            format!(
                "{}: {} quarantined, {} fenced{orphaned}; newest: {}",
                n.node,
                n.quarantined,
                n.fenced,
                newest.join(", ")
            )
        })
        .collect();
    if c.nodes_omitted > 0 {
        parts.push(format!("{} more nodes", c.nodes_omitted));
    }
    let mut text = if parts.is_empty() {
        "none in quarantine".to_owned()
    } else {
        parts.join("; ")
    };
    match (&c.read_at, &c.last_error) {
        (_, Some(error)) => text.push_str(&format!(" (last read FAILED: {error})")),
        (Some(at), None) => text.push_str(&format!(" (read {at})")),
        (None, None) => text = "not read yet".to_owned(),
    }
    text
}

/// The projection into whereabouts' reservations: what ipq holds, and why writing fails.
fn projected(w: &WhereaboutsView, now: SystemTime) -> String {
    let mut text = format!("reservations in {}", w.namespace);
    if !w.network_name.is_empty() {
        text.push_str(&format!(" (network {})", w.network_name));
    }
    text.push_str(&format!(
        ": {} of ipq's, {} held by other pods; {} writes ({} made again after whereabouts \
         deleted them), {} failed",
        w.reservations, w.foreign, w.writes_total, w.recreated_total, w.failures_total
    ));
    if w.orphaned > 0 {
        text.push_str(&format!(
            "; {} live holders whose pod was deleted under them (orphaned)",
            w.orphaned
        ));
    }
    if let Some(error) = &w.last_error {
        let since = w
            .failing_since
            .as_deref()
            .map(|at| format!(" since {}", absolute_and_relative(at, now)))
            .unwrap_or_default();
        text.push_str(&format!("; FAILING{since}: {error}"));
    }
    text
}

/// The node's NodeQuarantine object: how writing it goes, what it lists, and why it fails.
fn published(p: &PublishView, now: SystemTime) -> String {
    let mut text = format!("{} ({})", p.node, p.state);
    match &p.last_published_at {
        Some(at) => text.push_str(&format!(", written {}", absolute_and_relative(at, now))),
        None => text.push_str(", never written"),
    }
    text.push_str(&format!(", {} entries", p.entries));
    if p.orphaned > 0 {
        text.push_str(&format!(" ({} orphaned)", p.orphaned));
    }
    if p.omitted > 0 {
        text.push_str(&format!(" ({} LEFT OUT: over the object's cap)", p.omitted));
    }
    if let Some(withheld) = p.orphans_withheld {
        text.push_str(&format!(
            "; {withheld} ORPHANED LEFT OUT: the cluster's NodeQuarantine CRD lacks the state \
             (kubectl apply -f deploy/helm/ipq/crds/)"
        ));
    }
    text.push_str(&format!(
        "; {} writes, {} failed",
        p.writes_total, p.failures_total
    ));
    if let Some(error) = &p.last_error {
        let since = p
            .failing_since
            .as_deref()
            .map(|at| format!(" since {}", absolute_and_relative(at, now)))
            .unwrap_or_default();
        text.push_str(&format!("; FAILING{since}: {error}"));
    }
    text
}
