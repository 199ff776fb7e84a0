//! The pinned address map as the tests write and read it: entries set by hand (through the
//! agent, the maps' one writer, or the break-glass tool), listed, and waited for.

use std::{collections::BTreeMap, net::IpAddr, time::Duration};

use anyhow::{bail, Context as _};

use crate::netns::agent_binary;

use super::*;

/// The lab's pinned address map ([`Lab::maps`]).
pub struct Maps<'l> {
    lab: &'l Lab,
}

impl Lab {
    /// The lab's pinned address map, to write and read.
    pub fn maps(&self) -> Maps<'_> {
        Maps { lab: self }
    }
}

impl Maps<'_> {
    /// `ipq-agent datapath <args> --bpffs-dir <lab's>` (the break-glass tool) inside the node
    /// namespace (interface names resolve there). Returns stdout.
    pub fn tool(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.lab.node.command(agent_binary());
        cmd.arg("datapath")
            .args(args)
            .arg("--bpffs-dir")
            .arg(self.lab.bpffs.path());
        crate::netns::output_of(&mut cmd)
    }

    /// Pod a is draining and fenced on its own interface: all its traffic is to be dropped.
    pub fn fence_pod_a(&self) -> anyhow::Result<()> {
        for addr in [IpAddr::from(POD_A_V4), POD_A_V6.into()] {
            self.set_entry(addr, "draining", "vethpa", Some("vethpa"))?;
        }
        Ok(())
    }

    /// Pod b holds its addresses normally: all its traffic is to pass.
    pub fn register_pod_b(&self) -> anyhow::Result<()> {
        for addr in [IpAddr::from(POD_B_V4), POD_B_V6.into()] {
            self.set_entry(addr, "active", "vethpb", None)?;
        }
        Ok(())
    }

    /// Writes one datapath entry by hand: through the running agent (`PUT /v1/datapath/{ip}`),
    /// which is the maps' one writer, or with `ipq-agent datapath set` when none runs (which
    /// refuses while one does).
    pub fn set_entry(
        &self,
        addr: IpAddr,
        state: &str,
        holder: &str,
        fenced: Option<&str>,
    ) -> anyhow::Result<()> {
        let socket = self.lab.work_dir().join("ipq.sock");
        let body = serde_json::json!({ "state": state, "holder": holder, "fenced": fenced });
        match crate::api::request(
            &socket,
            "PUT",
            &format!("/v1/datapath/{addr}"),
            Some(&body.to_string()),
        ) {
            Ok(answer) if answer.status == 200 => return Ok(()),
            Ok(answer) => bail!("PUT /v1/datapath/{addr}: {} {}", answer.status, answer.body),
            // No agent listening: the break-glass tool writes the pinned maps itself.
            Err(_) => {}
        }
        let addr = addr.to_string();
        let mut args = vec!["set", &addr, "--state", state, "--holder", holder];
        if let Some(fenced) = fenced {
            args.extend(["--fenced", fenced]);
        }
        self.tool(&args).map(drop)
    }

    /// Every entry of the pinned address map, as `ipq-agent datapath show` prints it.
    pub fn entries(&self) -> anyhow::Result<BTreeMap<IpAddr, MapEntry>> {
        let out = self.tool(&["show"])?;
        let mut entries = BTreeMap::new();
        for line in out.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [addr, state, holder, fenced] = fields[..] else {
                continue;
            };
            let Ok(addr) = addr.parse::<IpAddr>() else {
                continue;
            };
            let entry = MapEntry {
                state: state.to_owned(),
                holder: holder
                    .parse()
                    .with_context(|| format!("holder in {line:?}"))?,
                fenced: fenced
                    .parse()
                    .with_context(|| format!("fenced in {line:?}"))?,
            };
            entries.insert(addr, entry);
        }
        Ok(entries)
    }

    /// The map entry of `addr`, if any.
    pub fn entry(&self, addr: IpAddr) -> anyhow::Result<Option<MapEntry>> {
        Ok(self.entries()?.remove(&addr))
    }

    /// Polls the map until `addr`'s entry satisfies `want` (None: no entry), for `timeout`.
    pub fn wait_entry(
        &self,
        addr: IpAddr,
        timeout: Duration,
        what: &str,
        want: impl Fn(Option<&MapEntry>) -> bool,
    ) -> anyhow::Result<Option<MapEntry>> {
        poll(&format!("{addr}: {what}"), timeout, || {
            let entry = self.entry(addr)?;
            Ok(want(entry.as_ref()).then_some(entry))
        })
    }
}

/// A map entry as the tests expect it.
pub fn map_entry(state: &str, holder: u32, fenced: u32) -> MapEntry {
    MapEntry {
        state: state.to_owned(),
        holder,
        fenced,
    }
}

/// Waits up to `settle` until `addr`'s map entry is exactly `want`; panics with what it saw.
pub fn wait_for_entry(lab: &Lab, addr: IpAddr, want: &MapEntry, settle: Duration) {
    lab.maps()
        .wait_entry(addr, settle, &format!("map entry {want:?}"), |e| {
            e == Some(want)
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Waits up to `settle` until the agent's start-up dump claimed pod a's and pod b's addresses
/// for their veths; returns (vethpa, vethpb).
pub fn wait_claimed_at_start(lab: &Lab, settle: Duration) -> (u32, u32) {
    let vethpa = ifindex(&lab.node, "vethpa").expect("vethpa");
    let vethpb = ifindex(&lab.node, "vethpb").expect("vethpb");
    for (addr, holder) in [
        (IpAddr::from(POD_A_V4), vethpa),
        (POD_A_V6.into(), vethpa),
        (POD_B_V4.into(), vethpb),
        (POD_B_V6.into(), vethpb),
    ] {
        wait_for_entry(lab, addr, &map_entry("active", holder, 0), settle);
    }
    (vethpa, vethpb)
}

/// One entry of the pinned address map. `holder` and `fenced` are ifindexes, 0 for none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    pub state: String,
    pub holder: u32,
    pub fenced: u32,
}
