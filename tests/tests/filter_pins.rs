//! The quarantine filter across upgrades: an older agent's pinned maps never open an
//! enforcement gap. Its single-hash bitmap (`IPQ_QFILTER`), which its still-attached XDP
//! programs read until the new agent replaces them, is set to all ones (every address goes to
//! the hash map) and unpinned once the new programs are attached; a pinned Bloom filter of
//! another size is adopted with its size, so the programs' mask always matches the map; a
//! pinned filter of a size no build uses is refused with an error naming it.
//!
//! Needs root and bpffs (`cargo xtask test` provides both); `bpftool` makes the old pins.

use std::{net::Ipv4Addr, path::Path, process::Command};

use anyhow::{bail, Context as _};
use aya::{
    maps::{Array, MapData},
    programs::{TestRun, TestRunOptions, Xdp},
};
use ipq::datapath::{Datapath, DatapathError, LoadOptions};
use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, NO_IFINDEX},
    config::Mode,
    counters::COUNTER_SLOTS,
    names,
    probe::PROBE_SLOTS,
};
use ipq_tests::{
    netns::{require_root, BpffsDir, NetNs},
    packets::{ethernet, ipv4, udp, Fragment, Vlan, ETH_P_IP, IPPROTO_UDP},
};

const XDP_PASS: u32 = 2;
const XDP_DROP: u32 = 1;

/// Pins an array map of u64 words at `bpffs/maps/<name>`, as an older agent left it.
fn pin_array(bpffs: &Path, name: &str, words: u32) -> anyhow::Result<()> {
    pin_map(bpffs, name, "array", 8, words)
}

/// A map made by `bpftool`, pinned at `name` in `bpffs`'s maps directory: another tool's or
/// another version's, of `kind` with 4-byte keys.
fn pin_map(bpffs: &Path, name: &str, kind: &str, value: u32, entries: u32) -> anyhow::Result<()> {
    let dir = bpffs.join("maps");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(name);
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&path)
        .args([
            "type",
            kind,
            "key",
            "4",
            "value",
            &value.to_string(),
            "entries",
        ])
        .arg(entries.to_string())
        .args(["name", name])
        .output()
        .context("running bpftool (cargo xtask setup installs it)")?;
    if !out.status.success() {
        bail!(
            "bpftool map create {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn words_of(path: &Path) -> anyhow::Result<Vec<u64>> {
    let map = aya::maps::Map::Array(MapData::from_pin(path)?);
    let array: Array<MapData, u64> = Array::try_from(map)?;
    (0..array.len())
        .map(|i| array.get(&i, 0).map_err(Into::into))
        .collect()
}

fn load(bpffs: &Path, capacity: u32) -> Result<Datapath, DatapathError> {
    Datapath::load(&LoadOptions {
        bpffs_dir: bpffs.to_path_buf(),
        capacity,
        mode: Mode::Enforce,
        slots_order: None,
        bpf_watcher: ipq::config::BpfWatcher::Auto,
    })
}

fn to(dst: Ipv4Addr) -> Vec<u8> {
    let packet = ipv4(
        Ipv4Addr::new(10, 99, 0, 1),
        dst,
        IPPROTO_UDP,
        Fragment::Whole,
        &udp(b"filter"),
    );
    ethernet(Vlan::Untagged, ETH_P_IP, &packet).bytes
}

fn xdp(dp: &mut Datapath, frame: &[u8]) -> anyhow::Result<u32> {
    let prog: &mut Xdp = dp
        .program_mut(names::PROG_XDP_UPLINK)
        .context("xdp program missing")?
        .try_into()?;
    Ok(prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            ..Default::default()
        })?
        .return_value)
}

#[test]
fn an_older_agents_bitmap_matches_everything_until_it_is_unpinned() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    pin_array(bpffs.path(), names::MAP_QFILTER_LEGACY, 1024)?;
    let legacy = bpffs.path().join("maps").join(names::MAP_QFILTER_LEGACY);
    assert!(words_of(&legacy)?.iter().all(|w| *w == 0));

    let dp = load(bpffs.path(), 1024).context("loading over an older agent's pins")?;
    let words = words_of(&legacy)?;
    assert_eq!(words.len(), 1024);
    assert!(
        words.iter().all(|w| *w == u64::MAX),
        "the old programs' bitmap must send every address to the hash map"
    );
    // The agent's prune after its first attach pass: with nothing configured, nothing to keep.
    // It looks for ipq's filters on every interface, so it runs in a namespace of its own.
    let overflows = ipq::queues::Overflows::new()?.of(ipq::queues::Queue::AttachReports);
    let (attacher, _reports) = dp.start_attacher(ipq::datapath::attach::TcMode::Tcx, overflows)?;
    let ns = NetNs::new("prune")?;
    ns.run(|| attacher.prune())?;
    assert!(!legacy.exists(), "the legacy pin outlives the upgrade");
    Ok(())
}

#[test]
fn a_pinned_filter_of_another_size_is_adopted_with_its_mask() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    // Capacity 65536 alone would make a 32768-word filter; the pin (of an agent configured
    // with a smaller capacity) has 1024: a mask for 32768 words would index past its end.
    pin_array(bpffs.path(), names::MAP_QFILTER, 1024)?;
    let mut dp = load(bpffs.path(), 65536).context("loading over a pinned filter")?;
    let quarantined = AddrEntry::new(AddrState::Quarantined, NO_IFINDEX, 1);
    let addrs: Vec<Ipv4Addr> = (0..200u32)
        .map(|i| Ipv4Addr::from(0x0a14_0000 + i))
        .collect();
    for addr in &addrs {
        dp.maps.table.put(AddrKey::from_ipv4(*addr), quarantined)?;
    }
    // With a mask that did not match the map, most of these would find their bits unset.
    for addr in &addrs {
        assert_eq!(
            xdp(&mut dp, &to(*addr))?,
            XDP_DROP,
            "stale traffic to {addr}"
        );
    }
    assert_eq!(xdp(&mut dp, &to(Ipv4Addr::new(10, 21, 0, 1)))?, XDP_PASS);
    let filter = bpffs.path().join("maps").join(names::MAP_QFILTER);
    assert_eq!(words_of(&filter)?.len(), 1024);
    Ok(())
}

#[test]
fn a_pinned_filter_of_an_unusable_size_is_refused_by_name() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    pin_array(bpffs.path(), names::MAP_QFILTER, 1000)?;
    match load(bpffs.path(), 1024) {
        Err(e @ DatapathError::IncompatiblePin { .. }) => {
            let text = e.to_string();
            assert!(text.contains(names::MAP_QFILTER), "{text}");
            assert!(text.contains("filter words"), "{text}");
            Ok(())
        }
        Err(e) => bail!("refused for another reason: {e}"),
        Ok(_) => bail!("a 1000-word filter was accepted"),
    }
}

/// A pinned `IPQ_PROBES` shorter than this build's hooks (an earlier version's, or anyone's):
/// replaced by one of this build's length, not refused, so that an upgrade past a new hook
/// goes through.
#[test]
fn a_shorter_pinned_probe_count_is_replaced() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    pin_array(bpffs.path(), names::MAP_PROBES, 1)?;
    let _dp = load(bpffs.path(), 1024)?;
    let pinned = bpffs.path().join("maps").join(names::MAP_PROBES);
    assert_eq!(words_of(&pinned)?.len(), PROBE_SLOTS as usize);
    Ok(())
}

/// A pinned `IPQ_PROBES` longer than this build's hooks (a later version's, which this one is
/// rolled back to): the same map kept, and the datapath loads on it (its programs, the spare
/// TC ones among them, pass the verifier with the longer array).
#[test]
fn a_longer_pinned_probe_count_is_kept() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    let longer = PROBE_SLOTS + 2;
    pin_array(bpffs.path(), names::MAP_PROBES, longer)?;
    let pinned = bpffs.path().join("maps").join(names::MAP_PROBES);
    let id_before = map_id(&pinned)?;
    let _dp = load(bpffs.path(), 1024)?;
    assert_eq!(words_of(&pinned)?.len(), longer as usize);
    assert_eq!(map_id(&pinned)?, id_before, "the pinned map was replaced");
    Ok(())
}

/// A pinned `IPQ_COUNTERS` of another length (another version's layout of actions, hooks and
/// reasons): replaced by one of this build's, its counts starting again from zero, instead of
/// counts read under the wrong labels or lost past its end.
#[test]
fn pinned_counters_of_another_layout_are_replaced() -> anyhow::Result<()> {
    require_root()?;
    let bpffs = BpffsDir::new()?;
    pin_map(
        bpffs.path(),
        names::MAP_COUNTERS,
        "percpu_array",
        16,
        COUNTER_SLOTS + 5,
    )?;
    let pinned = bpffs.path().join("maps").join(names::MAP_COUNTERS);
    let _dp = load(bpffs.path(), 1024)?;
    let entries = MapData::from_pin(&pinned)?.info()?.max_entries();
    assert_eq!(entries, COUNTER_SLOTS);
    Ok(())
}

fn map_id(path: &Path) -> anyhow::Result<u32> {
    Ok(MapData::from_pin(path)?.info()?.id())
}
