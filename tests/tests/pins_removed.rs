//! Someone removes ipq's pins under a running agent (a cleanup script, `rm -r
//! /sys/fs/bpf/ipq/links`). The agent holds a descriptor of its own on every link, map and
//! program it pinned, so nothing detaches; it pins them back, and a SIGTERM restart right after
//! such a removal lets no fenced packet through and finds the same links and maps.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{collections::BTreeMap, fs, path::Path, time::Duration};

use aya::{
    maps::MapData,
    programs::links::{FdLink, PinnedLink},
};
use ipq_tests::{
    attach::wait_tc_upgrades,
    flows::Flows,
    lab::{poll, Lab},
};

/// The kernel id of every object pinned in `dir`, by file name (`None` where the pin cannot
/// be opened as that kind).
fn pinned_ids(dir: &Path, id_of: fn(&Path) -> Option<u32>) -> BTreeMap<String, Option<u32>> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    (name, id_of(&e.path()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn link_id(path: &Path) -> Option<u32> {
    let link: FdLink = PinnedLink::from_pin(path).ok()?.into();
    Some(link.info().ok()?.id())
}

fn map_id(path: &Path) -> Option<u32> {
    Some(MapData::from_pin(path).ok()?.info().ok()?.id())
}

/// How many link and map pins there are (each one the agent holds and puts back).
fn pin_count(bpffs: &Path) -> usize {
    ["links", "maps"]
        .iter()
        .map(|dir| {
            fs::read_dir(bpffs.join(dir))
                .expect("reading a pin directory")
                .count()
        })
        .sum()
}

fn remove_every_pin(bpffs: &Path) {
    for dir in ["links", "maps", "progs"] {
        for entry in fs::read_dir(bpffs.join(dir)).expect("reading a pin directory") {
            fs::remove_file(entry.expect("a pin").path()).expect("removing a pin");
        }
    }
}

#[test]
fn removed_pins_detach_nothing_are_put_back_and_survive_a_sigterm_restart() {
    let lab = Lab::new().expect("building the lab");
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--verify-interval",
        "200ms",
    ];
    let mut agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    wait_tc_upgrades(&agent);
    let bpffs = lab.bpffs.path();
    let (links_dir, maps_dir) = (bpffs.join("links"), bpffs.join("maps"));
    let links = pinned_ids(&links_dir, link_id);
    let maps = pinned_ids(&maps_dir, map_id);
    // vethpa and vethpb: TCX ingress + egress each; up0: XDP.
    assert_eq!(links.len(), 5, "link pins: {links:?}");
    assert!(
        links.values().chain(maps.values()).all(Option::is_some),
        "{links:?} {maps:?}"
    );

    // Pinned links detach when their last reference goes: before, the pin was the only one.
    let flows = Flows::start(&lab);
    let removed = pin_count(bpffs);
    remove_every_pin(bpffs);
    let back = poll("every pin back", Duration::from_secs(10), || {
        let now = (
            pinned_ids(&links_dir, link_id),
            pinned_ids(&maps_dir, map_id),
        );
        Ok((now == (links.clone(), maps.clone())).then_some(()))
    });
    back.unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    // Each restored pin is counted (and so alerted on) as a pin taken away.
    poll("every removed pin counted", Duration::from_secs(10), || {
        let lost = agent.metric("ipq_datapath_attachments_lost_total", &[("what", "pin")])?;
        Ok((lost >= removed as f64).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    // The verification puts them back within its interval (200 ms here): a few datagrams.
    flows.stop_and_check(5, "while the pins were gone and put back");

    // Removed again, and the agent stopped before its periodic check could see it: the stop
    // itself puts them back, so the next agent finds the same links and maps.
    let flows = Flows::start(&lab);
    remove_every_pin(bpffs);
    agent.terminate().expect("stopping ipq-agent with SIGTERM");
    assert_eq!(
        pinned_ids(&links_dir, link_id),
        links,
        "links after the stop"
    );
    assert_eq!(pinned_ids(&maps_dir, map_id), maps, "maps after the stop");
    let agent = lab.start_agent(&args).expect("restarting ipq-agent");
    wait_tc_upgrades(&agent);
    // A restart is quick (~100 ms here): a few dozen datagrams per flow cross it.
    flows.stop_and_check(40, "across the removal, the SIGTERM and the restart");
    assert_eq!(
        pinned_ids(&links_dir, link_id),
        links,
        "the restart reused the links"
    );
    assert_eq!(
        pinned_ids(&maps_dir, map_id),
        maps,
        "the restart reused the maps"
    );
}
