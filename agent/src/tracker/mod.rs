//! The registry's owner: the one place where what netlink observes, what the kernel samples
//! and what time does become registry transitions, and where those transitions' effects reach
//! the datapath, the journal, the log and the metrics.

mod commands;
mod events;

pub use commands::Answer;
pub use events::RECENT_CONFLICTS;

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::SystemTime};

use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, FLAG_OBSERVE_ONLY, NO_IFINDEX},
    counters::Reason,
    sample::ConflictSample,
};
use log::{error, info, warn};

use self::events::EventHub;
use crate::{
    api::{
        model::EventBody,
        views::{conflict_view, Outcome, TimeBase},
    },
    config::{Config, EarlyReusePolicy, Mode},
    datapath::Datapath,
    journal::{Journal, JournalError},
    metrics::LostAt,
    metrics::Metrics,
    netdev,
    netlink::{NetEvent, NetState},
    registry::{
        datapath_entry, AddrRecord, AddrStatus, Conflict, ConflictKind, Effect, Holder, Registry,
        RegistryError, RegistrySettings, Snapshot, Source, SystemClock, SNAPSHOT_VERSION,
    },
};

/// The role of an interface under the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Workload,
    Uplink,
}

/// How the registry came back at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// From the journal.
    Journal,
    /// The journal was missing or unusable: rebuilt from the pinned maps.
    PinnedMaps,
}

/// A holder whose interface ipq cannot know any more (rebuilt from a bare datapath entry).
const UNKNOWN_IFINDEX: u32 = u32::MAX;

pub struct Tracker {
    config: Config,
    registry: Registry,
    datapath: Datapath,
    net: NetState,
    journal: Journal,
    metrics: Arc<Metrics>,
    /// Addresses an early reuse was let through on under `on_early_reuse = observe`: their
    /// holders all keep flowing, and what the datapath sees between them is only counted.
    observed_reuse: BTreeSet<IpAddr>,
    /// The API's event feed and recent conflicts.
    events: EventHub,
    started_at: SystemTime,
}

impl Tracker {
    pub fn new(
        config: Config,
        datapath: Datapath,
        journal: Journal,
        metrics: Arc<Metrics>,
    ) -> Self {
        let settings = RegistrySettings::from(&config);
        Self {
            registry: Registry::new(settings, SystemClock),
            config,
            datapath,
            net: NetState::default(),
            journal,
            metrics,
            observed_reuse: BTreeSet::new(),
            events: EventHub::new(),
            started_at: SystemTime::now(),
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn datapath(&self) -> &Datapath {
        &self.datapath
    }

    fn role(&self, ifname: &str) -> Option<Role> {
        if self.config.is_uplink(ifname) {
            Some(Role::Uplink)
        } else if self.config.workload_glob_matching(ifname).is_some() {
            Some(Role::Workload)
        } else {
            None
        }
    }

    /// Brings the registry back from the journal, merged with the pinned maps.
    ///
    /// The maps are written before the journal, so where an entry disagrees with the journal
    /// the map is the more recent truth (an agent killed between the two writes, or an
    /// operator's break-glass write): its enforcement is adopted, with the journal's richer
    /// holder identity where the interfaces match. A journal entry the maps lack is kept:
    /// maps are lost on reboot, and a quarantine must not be.
    pub fn recover(&mut self) -> Recovery {
        let (journal, recovery) = match self.journal.load() {
            Ok(Some(loaded)) => {
                if let Some(torn) = &loaded.torn_tail {
                    warn!(
                        "journal {}: dropped a torn tail of {} bytes at byte {} (a write cut \
                         short by a crash, never acknowledged)",
                        self.journal.path().display(),
                        torn.dropped,
                        torn.at
                    );
                }
                let mut snapshot = Snapshot {
                    version: SNAPSHOT_VERSION,
                    taken_at: loaded.written_mono_ns,
                    records: loaded.records,
                };
                if !loaded.same_boot {
                    // Monotonic stamps of another boot: carry them over by wall-clock time.
                    let now_unix_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64);
                    let elapsed_ns = now_unix_ms.saturating_sub(loaded.written_unix_ms) * 1_000_000;
                    let written_now = netdev::monotonic_ns().saturating_sub(elapsed_ns);
                    snapshot.rebase(loaded.written_mono_ns, written_now);
                }
                (snapshot.records, Recovery::Journal)
            }
            Ok(None) => {
                info!("journal: none yet in {}", self.journal.path().display());
                (Vec::new(), Recovery::PinnedMaps)
            }
            Err(JournalError::Corrupt {
                path,
                reason,
                moved_to,
            }) => {
                error!(
                    "journal {} is corrupt ({reason}); kept as {}; rebuilding from the pinned \
                     maps",
                    path.display(),
                    moved_to.display()
                );
                (Vec::new(), Recovery::PinnedMaps)
            }
            Err(e) => {
                error!("journal: {e}; rebuilding from the pinned maps");
                (Vec::new(), Recovery::PinnedMaps)
            }
        };
        let (merged, adopted) = self.merge_with_maps(journal);
        let count = merged.len();
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            taken_at: netdev::monotonic_ns(),
            records: merged,
        };
        match self.registry.restore(snapshot) {
            Ok(effects) => {
                info!("registry recovered ({recovery:?}): {count} addresses");
                self.apply_effects(effects);
                // The journal already holds what it gave; only what the maps changed is new
                // (when the journal is rewritten anyway, it takes everything).
                self.registry.take_changed();
                self.journal.stage(adopted);
            }
            Err(e) => {
                error!("recovering the registry failed ({e}); starting empty");
                self.journal.invalidate();
            }
        }
        crate::journal::release_freed_memory();
        recovery
    }

    /// The merged records, and the addresses where the maps overrode the journal.
    fn merge_with_maps(&self, journal: Vec<AddrRecord>) -> (Vec<AddrRecord>, Vec<IpAddr>) {
        let mut records: std::collections::BTreeMap<IpAddr, AddrRecord> = journal
            .into_iter()
            .map(|r| (r.addr.to_canonical(), r))
            .collect();
        // As the table read them from the pinned map when it opened, a moment ago: a second
        // full read of the map (two syscalls per entry) would tell nothing more.
        let entries = self.datapath.maps.table.cached();
        let mut adopted = Vec::new();
        let now = netdev::monotonic_ns();
        let settings = *self.registry.settings();
        for (key, entry) in entries {
            let addr = key.to_ip();
            let known = records.get(&addr);
            if known.is_some_and(|r| same_enforcement(&datapath_entry(r), &entry)) {
                continue;
            }
            if let Some(mut record) = record_from_entry(addr, &entry, now, &settings) {
                if let Some(known) = known {
                    keep_identities(&mut record, known);
                    warn!(
                        "{addr}: the datapath disagrees with the journal; adopting the datapath's"
                    );
                }
                records.insert(addr, record);
                adopted.push(addr);
            }
        }
        (records.into_values().collect(), adopted)
    }

    /// Takes a full netlink dump as the truth: attaches, claims what the routes say, and
    /// quarantines the addresses of holders whose interfaces went away while no agent ran.
    pub fn reconcile(&mut self, state: NetState) {
        let events = self.net.diff(&state);
        for event in events {
            self.on_event(event);
        }
        let holders: Vec<u32> = self
            .registry
            .iter()
            .flat_map(|r| r.live_holders().map(|h| h.ifindex).collect::<Vec<_>>())
            .collect();
        for ifindex in holders {
            if !self.net.links.contains_key(&ifindex) {
                let result = self.registry.holder_gone(ifindex);
                self.apply(result, "holder gone while the agent was down");
            }
        }
        // The datapath mirrors the registry exactly, whatever an earlier agent left.
        self.sync_datapath();
        self.update_gauges();
    }

    /// Rewrites every datapath entry from the registry, removing what it does not hold.
    fn sync_datapath(&mut self) {
        let wanted = self.registry.datapath_entries();
        let present = match self.datapath.maps.table.entries() {
            Ok(entries) => entries,
            Err(e) => {
                error!("reading the address map: {e}");
                return;
            }
        };
        let mut in_kernel = std::collections::HashMap::with_capacity(present.len());
        for (key, entry) in present {
            if !wanted.contains_key(&key.to_ip()) {
                if let Err(e) = self.datapath.maps.table.remove(&key) {
                    error!("{}: removing a stale datapath entry: {e}", key.to_ip());
                }
            } else {
                in_kernel.insert(key.to_ip(), entry);
            }
        }
        for (addr, entry) in wanted {
            let entry = self.with_observe_flag(addr, entry);
            // What the kernel holds already (an agent restart: nearly everything) is not
            // written again; what differs (a break-glass write) is.
            if !in_kernel
                .get(&addr)
                .is_some_and(|e| same_written(e, &entry))
            {
                self.put_entry(addr, entry);
            }
        }
    }

    fn with_observe_flag(&self, addr: IpAddr, mut entry: AddrEntry) -> AddrEntry {
        if self.observed_reuse.contains(&addr) {
            entry.flags |= FLAG_OBSERVE_ONLY;
        }
        entry
    }

    /// Writes `entry` unless the table already holds it as written (O(1), no syscall).
    fn write_entry(&mut self, addr: IpAddr, entry: AddrEntry) {
        let entry = self.with_observe_flag(addr, entry);
        let current = self.datapath.maps.table.get(&AddrKey::from(addr));
        if !current.is_some_and(|current| same_written(current, &entry)) {
            self.put_entry(addr, entry);
        }
    }

    fn put_entry(&mut self, addr: IpAddr, entry: AddrEntry) {
        if let Err(e) = self.datapath.maps.table.put(AddrKey::from(addr), entry) {
            error!("{addr}: datapath write failed, enforcement may lag the registry: {e}");
        }
    }

    /// One netlink event.
    pub fn on_event(&mut self, event: NetEvent) {
        match &event {
            NetEvent::Link { ifindex, name } => {
                let renamed = self.net.links.get(ifindex).is_some_and(|old| old != name);
                self.net.apply(&event);
                if !renamed {
                    self.attach(*ifindex, name);
                }
            }
            NetEvent::LinkGone { ifindex } => {
                let known = self.net.links.contains_key(ifindex);
                self.net.apply(&event);
                if known {
                    let result = self.registry.holder_gone(*ifindex);
                    self.apply(result, "interface deleted");
                    if let Err(e) = self.datapath.forget_interface(*ifindex) {
                        warn!("if{ifindex}: forgetting its links: {e}");
                    }
                }
            }
            NetEvent::HostRoute { addr, ifindex } => {
                self.net.apply(&event);
                if let Some(holder) = self.workload_holder(*ifindex) {
                    let result = self.registry.claim(*addr, holder, Source::Netlink);
                    self.apply(result, "host route added");
                }
            }
            NetEvent::HostRouteGone { addr, ifindex } => {
                self.net.apply(&event);
                // A route withdrawn while its interface lives: the holder is terminating.
                if let Some(holder) = self.workload_holder(*ifindex) {
                    let current = self
                        .registry
                        .get(*addr)
                        .and_then(|r| r.status.holder().cloned());
                    if current.is_some_and(|h| h.same_as(&holder)) {
                        let result = self.registry.drain(*addr, Some(&holder));
                        self.apply(result, "host route withdrawn");
                    }
                }
            }
            NetEvent::Neighbour { addr, .. } => {
                self.net.apply(&event);
                self.claim_behind_bridge_port(*addr);
            }
            NetEvent::Fdb { mac, .. } => {
                self.net.apply(&event);
                let addrs: Vec<IpAddr> = self
                    .net
                    .neighbours
                    .iter()
                    .filter(|(_, m)| m.as_ref() == Some(mac))
                    .map(|((addr, _), _)| *addr)
                    .collect();
                for addr in addrs {
                    self.claim_behind_bridge_port(addr);
                }
            }
            // A neighbour or FDB entry expiring says nothing about the holder's life: only its
            // interface going away does.
            NetEvent::NeighbourGone { .. } | NetEvent::FdbGone { .. } => {
                self.net.apply(&event);
            }
            NetEvent::Overrun => {}
        }
        self.update_gauges();
    }

    /// On bridge-plugin nodes a pod's address has no host route: the bridge resolved it to a
    /// MAC, and the forwarding database says which port (the pod's veth) that MAC is behind.
    fn claim_behind_bridge_port(&mut self, addr: IpAddr) {
        let Some(port) = self.net.port_of(addr) else {
            return;
        };
        let Some(holder) = self.workload_holder(port) else {
            return;
        };
        let current = self
            .registry
            .get(addr)
            .and_then(|r| r.status.holder().cloned());
        if current.as_ref().is_some_and(|h| h.same_as(&holder)) {
            return;
        }
        // A neighbour entry follows whoever last sent with the address; it is weaker evidence
        // than an explicit claim (CNI, API), which names a container. Letting it contest one
        // would hand the address back to an old holder whose early reuse was only observed,
        // losing the claimant's identity; the datapath sees that old holder's packets anyway.
        if current.is_some_and(|h| h.container_id.is_some()) {
            return;
        }
        let result = self.registry.claim(addr, holder, Source::Netlink);
        self.apply(result, "neighbour behind a bridge port");
    }

    fn workload_holder(&self, ifindex: u32) -> Option<Holder> {
        let name = self.net.links.get(&ifindex)?;
        (self.role(name) == Some(Role::Workload)).then(|| Holder::new(ifindex, name.clone()))
    }

    fn attach(&mut self, ifindex: u32, name: &str) {
        let result = match self.role(name) {
            Some(Role::Workload) => self.datapath.attach_workload(name, ifindex),
            Some(Role::Uplink) => self.datapath.attach_uplink(name, ifindex),
            None => return,
        };
        if let Err(e) = result {
            error!("{name} (if{ifindex}): not attached: {e}");
        }
    }

    /// Detaches what earlier agents attached and no configured interface needs now.
    pub fn prune_links(&self) {
        match self.datapath.prune_links() {
            Ok(removed) => {
                for (ifindex, point) in removed {
                    info!(
                        "detached if{ifindex} {}: no longer configured or gone",
                        point.as_str()
                    );
                }
            }
            Err(e) => warn!("pruning stale link pins: {e}"),
        }
    }

    /// Ends the quarantines that are due.
    pub fn tick(&mut self) {
        self.refresh_stale();
        let result = self.registry.tick();
        self.apply(result, "cool-down over");
        self.update_gauges();
    }

    /// When `tick` has work next (monotonic ns).
    pub fn next_deadline(&self) -> Option<u64> {
        self.registry.next_deadline()
    }

    /// Carries the kernel's stale-traffic stamps of the quarantines due now into the registry,
    /// where they may push the release back. Stale traffic reaches the registry as samples while
    /// it happens, but at most one per address per sample interval, and none when the ring is
    /// full: before a release, the map's own stamp (exact) has the last word. One lookup per
    /// quarantine due, never a scan of the map.
    fn refresh_stale(&mut self) {
        let due: Vec<IpAddr> = self.registry.due(netdev::monotonic_ns()).collect();
        for addr in due {
            let entry = match self.datapath.maps.table.kernel_entry(&AddrKey::from(addr)) {
                Ok(Some(entry)) => entry,
                Ok(None) => continue,
                Err(e) => {
                    warn!("{addr}: reading its stale-traffic stamp: {e}");
                    continue;
                }
            };
            if entry.state() != Some(AddrState::Quarantined) || entry.last_stale_ns == 0 {
                continue;
            }
            let known = match self.registry.get(addr).map(|r| &r.status) {
                Some(AddrStatus::Quarantined { last_stale, .. }) => *last_stale,
                _ => continue,
            };
            if known.is_none_or(|k| entry.last_stale_ns > k) {
                let result = self.registry.stale_seen(addr, entry.last_stale_ns);
                self.apply(result, "stale traffic");
            }
        }
    }

    /// One conflict sample from the kernel.
    pub fn on_sample(&mut self, sample: &ConflictSample) {
        let addr = sample.addr.to_ip();
        self.publish_sample(sample);
        match Reason::from_raw(sample.reason) {
            Some(Reason::StaleTraffic) => {
                if let Some(AddrStatus::Quarantined { since, .. }) =
                    self.registry.get(addr).map(|r| &r.status)
                {
                    let age = sample.ts_ns.saturating_sub(*since) as f64 / 1e9;
                    self.metrics.stale_traffic_age_seconds.observe(age);
                }
                let result = self.registry.stale_seen(addr, sample.ts_ns);
                self.apply(result, "stale traffic");
            }
            Some(Reason::RemoteClaim) => {
                let result = self.registry.remote_claim(addr);
                self.apply(result, "remote claim");
            }
            // On an address whose early reuse was let through, the old holder's packets are the
            // evidence of the conflict already recorded, not a new one.
            Some(Reason::DuplicateSource) if self.observed_reuse.contains(&addr) => {}
            Some(Reason::DuplicateSource) => {
                let result = self.registry.duplicate_source(addr, sample.ifindex);
                self.apply(result, "duplicate source");
            }
            _ => {}
        }
    }

    /// Applies a transition's effects, or reports why there was none.
    fn apply(&mut self, result: Result<Vec<Effect>, RegistryError>, why: &str) {
        // Only explicit claims (the API) can be refused; they record their conflict there.
        match result {
            Ok(effects) => self.apply_effects(effects),
            Err(e) => warn!("{why}: {e}"),
        }
    }

    fn apply_effects(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Upsert { addr, entry } => self.write_entry(addr, entry),
                Effect::Remove { addr } => {
                    self.observed_reuse.remove(&addr);
                    if let Err(e) = self.datapath.maps.table.remove(&AddrKey::from(addr)) {
                        error!("{addr}: datapath removal failed: {e}");
                    }
                }
                Effect::Conflict(conflict) => {
                    let reuse = matches!(
                        conflict.kind,
                        ConflictKind::EarlyReuse | ConflictKind::ReuseInCooldown
                    );
                    if reuse && conflict.policy == EarlyReusePolicy::Observe {
                        self.observed_reuse.insert(conflict.addr);
                        if let Some(entry) = self.registry.get(conflict.addr).map(datapath_entry) {
                            self.write_entry(conflict.addr, entry);
                        }
                    }
                    let outcome = self.outcome_of(&conflict);
                    self.record_conflict(&conflict, outcome);
                }
                Effect::Transition {
                    addr,
                    from,
                    to,
                    holder,
                } => {
                    let shown = holder.as_ref().map(|h| h.to_string()).unwrap_or_default();
                    info!(target: "ipq::transition", "{addr}: {} -> {} {shown}", from.as_str(), to.as_str());
                    let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
                    self.events.publish(
                        at,
                        EventBody::Transition {
                            address: addr,
                            from,
                            to,
                            holder,
                        },
                    );
                }
                Effect::Released {
                    addr,
                    quarantined_for_ns,
                } => {
                    let seconds = quarantined_for_ns as f64 / 1e9;
                    self.metrics.quarantine_duration_seconds.observe(seconds);
                    info!("{addr}: released after {seconds:.1}s of quarantine");
                }
            }
        }
    }

    /// What the policy did about `conflict`, judged from the registry after it.
    fn outcome_of(&self, conflict: &Conflict) -> Outcome {
        let record = self.registry.get(conflict.addr);
        let old_fenced = match (record, &conflict.old) {
            (Some(record), Some(old)) => record.is_fenced(old),
            _ => false,
        };
        let observing =
            self.config.mode == Mode::Observe || self.observed_reuse.contains(&conflict.addr);
        match conflict.kind {
            ConflictKind::EarlyReuse | ConflictKind::ReuseInCooldown => match conflict.policy {
                EarlyReusePolicy::Observe => Outcome::Observed,
                EarlyReusePolicy::RefuseNew => Outcome::BlockedNew,
                EarlyReusePolicy::FenceOld if old_fenced => Outcome::FencedOld,
                EarlyReusePolicy::FenceOld => Outcome::Claimed,
            },
            ConflictKind::DuplicateSource if observing => Outcome::Observed,
            ConflictKind::DuplicateSource => Outcome::Dropped,
            ConflictKind::RemoteClaim if old_fenced => Outcome::FencedOld,
            ConflictKind::RemoteClaim => Outcome::Reported,
        }
    }

    /// Counts, logs (rate-limited) and publishes one conflict.
    fn record_conflict(&mut self, conflict: &Conflict, outcome: Outcome) {
        self.metrics
            .conflicts
            .with_label_values(&[conflict.kind.as_str()])
            .inc();
        let view = conflict_view(conflict, outcome, &TimeBase::now());
        if self.events.may_log() {
            let line = serde_json::json!({ "event": "conflict", "conflict": &view });
            warn!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.events.conflict(view);
    }

    /// Logs (rate-limited) and publishes one kernel sample.
    fn publish_sample(&mut self, sample: &ConflictSample) {
        let time = TimeBase::now();
        let addr = sample.addr.to_ip();
        let holder = self.registry.get(addr).map(|r| match &r.status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        let seen_on = self.interface_name(sample.ifindex);
        let body = events::sample_body(sample, seen_on, holder);
        if self.events.may_log() {
            let mut line = serde_json::json!({ "event": "conflict_sample" });
            if let (Some(map), Ok(serde_json::Value::Object(fields))) =
                (line.as_object_mut(), serde_json::to_value(&body))
            {
                map.extend(fields);
                map.insert("at".into(), time.rfc3339(sample.ts_ns).into());
            }
            info!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.events.publish(time.rfc3339(sample.ts_ns), body);
    }

    /// Makes every registry change since the last commit durable: one appended journal line
    /// and one fdatasync for all of them.
    pub fn persist(&mut self) {
        if let Err(e) = self.journal.commit(&mut self.registry) {
            error!("journal: {e} (will retry)");
        }
    }

    fn update_gauges(&self) {
        self.metrics.observe_registry(&self.registry);
        let attached = self.datapath.attached();
        self.metrics
            .observe_attachments(attached.keys().map(|(_, p)| *p));
        self.metrics
            .registry_entries
            .set(self.datapath.maps.table.len() as i64);
    }

    /// Writes what is still unsaved; the datapath keeps enforcing through its pins.
    pub fn shutdown(mut self) {
        self.persist();
    }
}

/// Whether two datapath entries enforce the same thing (ignoring the stamps).
fn same_enforcement(a: &AddrEntry, b: &AddrEntry) -> bool {
    a.state == b.state
        && a.holder_ifindex == b.holder_ifindex
        && a.fenced_ifindex == b.fenced_ifindex
}

/// Whether two datapath entries hold the same agent-written fields (the kernel's stamps aside).
fn same_written(a: &AddrEntry, b: &AddrEntry) -> bool {
    same_enforcement(a, b) && a.flags == b.flags && a.since_ns == b.since_ns
}

/// Gives `adopted` the identities (container, pod, names) `known` had for the same interfaces.
fn keep_identities(adopted: &mut AddrRecord, known: &AddrRecord) {
    let known_holders: Vec<Holder> = known
        .status
        .holder()
        .into_iter()
        .chain(known.fenced.as_ref())
        .chain(known.blocked_claimant.as_ref())
        .chain(known.displaced.iter())
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
    if let Some(fenced) = adopted.fenced.as_mut() {
        restore(fenced);
    }
}

/// A registry record for a bare datapath entry: all that is left when the journal is gone.
fn record_from_entry(
    addr: IpAddr,
    entry: &AddrEntry,
    now: u64,
    settings: &RegistrySettings,
) -> Option<AddrRecord> {
    let since = entry.since_ns.min(now);
    let holder = |ifindex: u32| {
        let name = netdev::interfaces()
            .ok()
            .and_then(|list| list.into_iter().find(|(i, _)| *i == ifindex))
            .map_or_else(|| format!("if{ifindex}"), |(_, name)| name);
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
    Some(AddrRecord {
        addr,
        status,
        fenced,
        blocked_claimant: None,
        displaced: Vec::new(),
        conflicts: 0,
    })
}
