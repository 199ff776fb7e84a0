//! The metric set without a kernel: the packet counters come from a fake reader.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};
use strum::VariantArray as _;

use ipq_common::counters::{
    counter_index, Action, Counter, Hook, Reason, COUNTER_SLOTS, SAMPLES_LOST_INDEX,
};
use prometheus::proto::{MetricFamily, MetricType};

use super::{LostAt, Metrics, ReadCounters};
use crate::{
    datapath::DatapathError,
    paths::AttachPoint,
    registry::{FakeClock, Holder, Registry, RegistrySettings, Source},
};

/// Slot i counts i packets and 100 * i bytes: every series has a value of its own.
fn distinct_counters() -> Vec<Counter> {
    (0..u64::from(COUNTER_SLOTS))
        .map(|i| Counter {
            packets: i,
            bytes: 100 * i,
        })
        .collect()
}

fn metrics_reading(counters: Vec<Counter>) -> Metrics {
    let read: ReadCounters = Box::new(move || Ok(counters.clone()));
    Metrics::with_counters(read).expect("metrics")
}

fn gather(metrics: &Metrics) -> BTreeMap<String, MetricFamily> {
    metrics
        .registry
        .gather()
        .into_iter()
        .map(|f| (f.name().to_owned(), f))
        .collect()
}

/// Every series of `family` as "label=value,..." → value (counter or gauge).
fn series(families: &BTreeMap<String, MetricFamily>, family: &str) -> BTreeMap<String, f64> {
    let f = families
        .get(family)
        .unwrap_or_else(|| panic!("no family {family}"));
    f.get_metric()
        .iter()
        .map(|m| {
            let labels = m
                .get_label()
                .iter()
                .map(|l| format!("{}={}", l.name(), l.value()))
                .collect::<Vec<_>>()
                .join(",");
            let value = match f.get_field_type() {
                MetricType::COUNTER => m.get_counter().get_value(),
                MetricType::GAUGE => m.get_gauge().get_value(),
                other => panic!("{family}: {other:?} has no single value"),
            };
            (labels, value)
        })
        .collect()
}

fn keys(series: &BTreeMap<String, f64>) -> BTreeSet<String> {
    series.keys().cloned().collect()
}

fn set(items: impl IntoIterator<Item = String>) -> BTreeSet<String> {
    items.into_iter().collect()
}

#[test]
fn every_labelled_family_has_all_its_series_at_the_first_scrape() {
    let families = gather(&metrics_reading(vec![
        Counter::default();
        COUNTER_SLOTS as usize
    ]));
    let hook_reasons = set(Hook::VARIANTS.iter().flat_map(|h| {
        Reason::VARIANTS
            .iter()
            .map(move |r| format!("hook={},reason={}", h.as_ref(), r.as_ref()))
    }));
    for action in ["dropped", "observed", "reported"] {
        for unit in ["packets", "bytes"] {
            let name = format!("ipq_{action}_{unit}_total");
            assert_eq!(keys(&series(&families, &name)), hook_reasons, "{name}");
        }
    }
    let expect = [
        (
            "ipq_conflicts_total",
            set([
                "kind=early_reuse".into(),
                "kind=reuse_in_cooldown".into(),
                "kind=duplicate_source".into(),
                "kind=remote_claim".into(),
            ]),
        ),
        (
            "ipq_addresses",
            set([
                "state=active".into(),
                "state=draining".into(),
                "state=quarantined".into(),
            ]),
        ),
        (
            "ipq_events_lost_total",
            set([
                "source=kernel".into(),
                "source=log".into(),
                "source=api".into(),
                "source=queue".into(),
            ]),
        ),
        (
            "ipq_datapath_interfaces",
            set([
                "hook=tc_ingress".into(),
                "hook=tc_egress".into(),
                "hook=xdp".into(),
            ]),
        ),
        (
            "ipq_hygiene_failures_total",
            set([
                "step=conntrack".into(),
                "step=neighbours".into(),
                "step=announce".into(),
            ]),
        ),
    ];
    for (name, want) in expect {
        let got = series(&families, name);
        assert_eq!(keys(&got), want, "{name}");
        assert!(
            got.values().all(|v| *v == 0.0),
            "{name} starts at 0: {got:?}"
        );
    }
    let build = series(&families, "ipq_build_info");
    assert_eq!(
        build,
        BTreeMap::from([(
            format!(
                "profile={},version={}",
                super::PROFILE,
                env!("CARGO_PKG_VERSION")
            ),
            1.0
        )])
    );
}

#[test]
fn every_family_follows_the_naming_conventions() {
    let families = gather(&metrics_reading(distinct_counters()));
    // Names DESIGN §5 promises, exactly.
    for name in [
        "ipq_addresses",
        "ipq_conflicts_total",
        "ipq_dropped_packets_total",
        "ipq_stale_traffic_age_seconds",
        "ipq_quarantine_duration_seconds",
        "ipq_refused_claims_total",
        "ipq_registry_entries",
        "ipq_registry_capacity",
        "ipq_datapath_interfaces",
        "ipq_events_lost_total",
        "ipq_netlink_resyncs_total",
        "ipq_build_info",
        "ipq_ready",
        "ipq_conntrack_entries_flushed_total",
        "ipq_neighbours_flushed_total",
        "ipq_announcements_total",
        "ipq_announcements_rate_limited_total",
        "ipq_hygiene_failures_total",
        "ipq_queue_overflows_total",
        "process_start_time_seconds",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
    ] {
        assert!(families.contains_key(name), "{name} is missing");
    }
    // Labels whose values are unbounded (one per address, interface or pod) must not exist.
    let unbounded = [
        "addr",
        "address",
        "ip",
        "ifname",
        "interface",
        "pod",
        "container",
    ];
    for (name, family) in &families {
        assert!(
            name.starts_with("ipq_") || name.starts_with("process_"),
            "{name}: no ipq_ prefix"
        );
        assert!(
            family.help().len() > 20,
            "{name}: HELP must explain: {:?}",
            family.help()
        );
        let is_counter = family.get_field_type() == MetricType::COUNTER;
        assert_eq!(
            name.ends_with("_total"),
            is_counter,
            "{name}: _total iff a counter"
        );
        if family.get_field_type() == MetricType::HISTOGRAM {
            assert!(name.ends_with("_seconds"), "{name}: durations in seconds");
        }
        for metric in family.get_metric() {
            for label in metric.get_label() {
                assert!(
                    !unbounded.contains(&label.name()),
                    "{name}: unbounded label {}",
                    label.name()
                );
            }
        }
    }
}

#[test]
fn packet_counters_carry_the_kernel_slot_of_their_action_hook_and_reason() {
    let families = gather(&metrics_reading(distinct_counters()));
    for &action in Action::VARIANTS {
        let packets = series(&families, &format!("ipq_{}_packets_total", action.as_ref()));
        let bytes = series(&families, &format!("ipq_{}_bytes_total", action.as_ref()));
        for &hook in Hook::VARIANTS {
            for &reason in Reason::VARIANTS {
                let key = format!("hook={},reason={}", hook.as_ref(), reason.as_ref());
                let slot = f64::from(counter_index(action, hook, reason));
                assert_eq!(packets[&key], slot, "{action:?} packets {key}");
                assert_eq!(bytes[&key], 100.0 * slot, "{action:?} bytes {key}");
            }
        }
    }
    let lost = series(&families, "ipq_events_lost_total");
    assert_eq!(lost["source=kernel"], f64::from(SAMPLES_LOST_INDEX));
}

#[test]
fn events_lost_in_user_space_count_under_their_source() {
    let metrics = metrics_reading(distinct_counters());
    metrics.events_lost(LostAt::Log, 3);
    metrics.events_lost(LostAt::Api, 5);
    metrics.events_lost(LostAt::Log, 4);
    let lost = series(&gather(&metrics), "ipq_events_lost_total");
    assert_eq!(lost["source=log"], 7.0);
    assert_eq!(lost["source=api"], 5.0);
    assert_eq!(lost["source=kernel"], f64::from(SAMPLES_LOST_INDEX));
}

#[test]
fn unreadable_kernel_counters_leave_packet_families_out_not_zeroed() {
    let fail = Arc::new(AtomicBool::new(false));
    let failing = fail.clone();
    let read: ReadCounters = Box::new(move || {
        if failing.load(Ordering::SeqCst) {
            Err(DatapathError::Io {
                path: "/sys/fs/bpf/test/counters".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })
        } else {
            Ok(distinct_counters())
        }
    });
    let metrics = Metrics::with_counters(read).expect("metrics");
    metrics.events_lost(LostAt::Api, 2);
    assert!(gather(&metrics).contains_key("ipq_dropped_packets_total"));
    fail.store(true, Ordering::SeqCst);
    let families = gather(&metrics);
    // A counter read as 0 would look like a reset to rate(); a missing one is a gap.
    assert!(!families.contains_key("ipq_dropped_packets_total"));
    assert_eq!(
        series(&families, "ipq_events_lost_total"),
        BTreeMap::from([
            ("source=api".into(), 2.0),
            ("source=log".into(), 0.0),
            ("source=queue".into(), 0.0)
        ])
    );
}

#[test]
fn readiness_shows_as_ipq_ready() {
    let metrics = metrics_reading(distinct_counters());
    let ready = |m: &Metrics| series(&gather(m), "ipq_ready")[""];
    assert!(!metrics.readiness.is_ready());
    assert_eq!(ready(&metrics), 0.0);
    metrics.readiness.set_started(true);
    assert!(metrics.readiness.is_ready());
    assert_eq!(ready(&metrics), 1.0);
    metrics.readiness.set_started(false);
    assert!(!metrics.readiness.is_ready());
    assert_eq!(ready(&metrics), 0.0);
}

#[test]
fn attachments_are_counted_by_hook() {
    let metrics = metrics_reading(distinct_counters());
    metrics.observe_attachments(
        [
            AttachPoint::TcxIngress,
            AttachPoint::TcxEgress,
            AttachPoint::TcxIngress,
            AttachPoint::TcxEgress,
            AttachPoint::Xdp,
        ]
        .into_iter(),
    );
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_interfaces"),
        BTreeMap::from([
            ("hook=tc_egress".into(), 2.0),
            ("hook=tc_ingress".into(), 2.0),
            ("hook=xdp".into(), 1.0),
        ])
    );
    // An interface gone: its hook goes back down, and an unused hook reads 0, not absent.
    metrics.observe_attachments([AttachPoint::TcxIngress].into_iter());
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_interfaces"),
        BTreeMap::from([
            ("hook=tc_egress".into(), 0.0),
            ("hook=tc_ingress".into(), 1.0),
            ("hook=xdp".into(), 0.0),
        ])
    );
}

#[test]
fn unprotected_interfaces_and_attach_failures_by_hook_and_readiness_follows_them() {
    let metrics = metrics_reading(distinct_counters());
    let all_zero = BTreeMap::from([
        ("hook=tc_egress".into(), 0.0),
        ("hook=tc_ingress".into(), 0.0),
        ("hook=xdp".into(), 0.0),
    ]);
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_unprotected_interfaces"),
        all_zero
    );
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_attach_failures_total"),
        all_zero
    );
    metrics.readiness.set_started(true);
    assert!(metrics.readiness.is_ready());

    let failures = BTreeMap::from([(AttachPoint::TcxIngress, 3), (AttachPoint::Xdp, 1)]);
    metrics.observe_unprotected([AttachPoint::TcxIngress].into_iter(), &failures);
    metrics
        .readiness
        .set_blocker(Some("vethpa (if7) failed: boom".into()));
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_unprotected_interfaces"),
        BTreeMap::from([
            ("hook=tc_egress".into(), 0.0),
            ("hook=tc_ingress".into(), 1.0),
            ("hook=xdp".into(), 0.0),
        ])
    );
    assert!(!metrics.readiness.is_ready());
    assert_eq!(
        metrics.readiness.check().map_err(|e| e.to_string()),
        Err("vethpa (if7) failed: boom".to_owned())
    );

    // Fixed: the gauge goes down, the failures stay counted (and never go back), ready again.
    metrics.observe_unprotected(std::iter::empty(), &failures);
    metrics.readiness.set_blocker(None);
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_unprotected_interfaces"),
        all_zero
    );
    assert_eq!(
        series(&gather(&metrics), "ipq_datapath_attach_failures_total"),
        BTreeMap::from([
            ("hook=tc_egress".into(), 0.0),
            ("hook=tc_ingress".into(), 3.0),
            ("hook=xdp".into(), 1.0),
        ])
    );
    assert!(metrics.readiness.is_ready());
    assert_eq!(metrics.readiness.check(), Ok(()));
    metrics.readiness.set_started(false);
    assert!(metrics
        .readiness
        .check()
        .unwrap_err()
        .to_string()
        .contains("starting"));
}

#[test]
fn registry_states_and_full_rejections_follow_the_registry() {
    let metrics = metrics_reading(distinct_counters());
    let settings = RegistrySettings {
        capacity: 2,
        ..RegistrySettings::default()
    };
    let mut registry = Registry::new(settings, FakeClock::new(1_000));
    let addr = |last: u8| IpAddr::from([10, 0, 0, last]);
    for (i, last) in [1u8, 2].into_iter().enumerate() {
        registry
            .claim(
                addr(last),
                Holder::new(10 + i as u32, "veth"),
                Source::Netlink,
            )
            .expect("claim");
    }
    registry
        .lifecycle_mut()
        .drain(addr(2), None)
        .expect("drain");
    for _ in 0..3 {
        assert!(registry
            .claim(addr(3), Holder::new(20, "vethc"), Source::Netlink)
            .is_err());
    }
    metrics.observe_registry(&registry);
    // Observing again without new rejections must not count them twice.
    metrics.observe_registry(&registry);
    let families = gather(&metrics);
    assert_eq!(
        series(&families, "ipq_addresses"),
        BTreeMap::from([
            ("state=active".into(), 1.0),
            ("state=draining".into(), 1.0),
            ("state=quarantined".into(), 0.0),
        ])
    );
    assert_eq!(
        series(&families, "ipq_registry_full_rejections_total")[""],
        3.0
    );
}

#[test]
fn the_agent_own_process_metrics_are_plausible() {
    let families = gather(&metrics_reading(distinct_counters()));
    let value = |name: &str| series(&families, name)[""];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let started = value("process_start_time_seconds");
    assert!(
        started > now - 24.0 * 3600.0 && started <= now + 5.0,
        "this test process started at {started}, now is {now}"
    );
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_max_fds") >= value("process_open_fds"));
    assert!(value("process_threads") >= 1.0);
}
