//! What is attached to an interface's TC and XDP hooks, whichever way it was attached: TCX
//! links (kernels from 6.6, or with TCX backported), cls_bpf filters on a clsact qdisc over
//! netlink (older kernels), and the XDP program. Tests use it to check that ipq has exactly
//! one attachment per hook, also after an agent restart, and which one it is.

use std::process::Command;

use anyhow::{bail, Context as _};
use aya::programs::{loaded_links, loaded_programs, ProgramError, SchedClassifier, TcAttachType};
use ipq_common::names;

use crate::netns::{output_of, NetNs};

/// One program attached at a hook, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// A TCX program; `link` is the id of the bpf_link holding it (None if it was attached
    /// without a link).
    Tcx {
        prog_name: String,
        link: Option<u32>,
    },
    /// A cls_bpf filter of the clsact qdisc.
    Filter {
        prog_name: String,
        priority: u16,
        handle: u32,
    },
    /// The interface's XDP program; `link` as for TCX.
    Xdp {
        prog_name: String,
        link: Option<u32>,
    },
}

impl Attachment {
    pub fn prog_name(&self) -> &str {
        match self {
            Attachment::Tcx { prog_name, .. }
            | Attachment::Filter { prog_name, .. }
            | Attachment::Xdp { prog_name, .. } => prog_name,
        }
    }

    /// Whether this is ipq's: a TC filter must also sit at ipq's own priority and handle.
    pub fn is_ipq(&self) -> bool {
        let named = self.prog_name().starts_with("ipq_");
        match self {
            Attachment::Filter {
                priority, handle, ..
            } => {
                named
                    && *priority == names::TC_FILTER_PRIORITY
                    && *handle == names::TC_FILTER_HANDLE
            }
            _ => named,
        }
    }
}

/// Every program at the TC hook `attach` of `ifname` in `ns`: TCX programs first, then
/// cls_bpf filters.
pub fn tc(ns: &NetNs, ifname: &str, attach: TcAttachType) -> anyhow::Result<Vec<Attachment>> {
    let mut found = tcx(ns, ifname, attach)?;
    found.extend(tc_filters(ns, ifname, attach)?);
    Ok(found)
}

/// The TCX programs of the hook; none on a kernel without TCX.
fn tcx(ns: &NetNs, ifname: &str, attach: TcAttachType) -> anyhow::Result<Vec<Attachment>> {
    let programs = match ns.run(|| SchedClassifier::query_tcx(ifname, attach)) {
        Ok((_, programs)) => programs,
        // BPF_PROG_QUERY refuses the TCX attach types where the kernel has no TCX.
        Err(ProgramError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EINVAL) => {
            return Ok(Vec::new())
        }
        Err(e) => bail!("query_tcx {ifname} {attach:?} in {}: {e}", ns.name()),
    };
    programs
        .iter()
        .map(|p| {
            Ok(Attachment::Tcx {
                prog_name: p.name_as_str().unwrap_or("?").to_owned(),
                link: link_of(p.id())?,
            })
        })
        .collect()
}

/// The id of the bpf_link that holds program `prog_id`, if any.
fn link_of(prog_id: u32) -> anyhow::Result<Option<u32>> {
    for link in loaded_links() {
        let link = link.context("listing bpf links")?;
        if link.program_id() == prog_id {
            return Ok(Some(link.id()));
        }
    }
    Ok(None)
}

/// The name of loaded program `id`.
fn prog_name(id: u32) -> anyhow::Result<String> {
    for program in loaded_programs() {
        let program = program.context("listing bpf programs")?;
        if program.id() == id {
            return Ok(program.name_as_str().unwrap_or("?").to_owned());
        }
    }
    bail!("no loaded bpf program {id}")
}

/// The cls_bpf filters of the clsact hook, from `tc -j filter show` (none without clsact).
fn tc_filters(ns: &NetNs, ifname: &str, attach: TcAttachType) -> anyhow::Result<Vec<Attachment>> {
    let hook = match attach {
        TcAttachType::Ingress => "ingress",
        TcAttachType::Egress => "egress",
        other => bail!("no clsact hook for {other:?}"),
    };
    let json = output_of(Command::new("tc").args([
        "-n",
        ns.name(),
        "-j",
        "filter",
        "show",
        "dev",
        ifname,
        hook,
    ]))?;
    parse_tc_filters(&json).with_context(|| format!("tc -j filter show dev {ifname} {hook}"))
}

/// Parses `tc -j filter show`: every object with options is a filter (the others head each
/// priority's chain).
pub fn parse_tc_filters(json: &str) -> anyhow::Result<Vec<Attachment>> {
    let json = json.trim();
    if json.is_empty() {
        return Ok(Vec::new());
    }
    let filters: Vec<serde_json::Value> = serde_json::from_str(json).context("not JSON")?;
    let mut found = Vec::new();
    for filter in filters {
        let Some(options) = filter.get("options") else {
            continue;
        };
        if filter["kind"] != "bpf" {
            continue;
        }
        let priority = filter["pref"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .with_context(|| format!("no pref in {filter}"))?;
        let handle = match &options["handle"] {
            serde_json::Value::String(hex) => {
                u32::from_str_radix(hex.trim_start_matches("0x"), 16).ok()
            }
            value => value.as_u64().and_then(|h| u32::try_from(h).ok()),
        }
        .with_context(|| format!("no handle in {filter}"))?;
        let prog_name = options["bpf_name"]
            .as_str()
            .or_else(|| options["prog"]["name"].as_str())
            .unwrap_or("?")
            .to_owned();
        found.push(Attachment::Filter {
            prog_name,
            priority,
            handle,
        });
    }
    Ok(found)
}

/// The XDP program of `ifname` in `ns`, if any, from `ip -j link show`.
pub fn xdp(ns: &NetNs, ifname: &str) -> anyhow::Result<Option<Attachment>> {
    let json = ns.ip(&["-j", "link", "show", "dev", ifname])?;
    let links: Vec<serde_json::Value> =
        serde_json::from_str(json.trim()).with_context(|| format!("ip -j link show: {json}"))?;
    let Some(xdp) = links.first().and_then(|l| l.get("xdp")) else {
        return Ok(None);
    };
    let id = xdp["prog"]["id"]
        .as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .with_context(|| format!("no xdp.prog.id in {xdp}"))?;
    Ok(Some(Attachment::Xdp {
        prog_name: prog_name(id)?,
        link: link_of(id)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tc_filter_dump_is_parsed() {
        // As iproute2 6.1 prints it: the chain head, then the filter.
        let json = r#"[{"protocol":"all","pref":18769,"kind":"bpf","chain":0},
            {"protocol":"all","pref":18769,"kind":"bpf","chain":0,"options":{"handle":"0x4951",
            "bpf_name":"ipq_tc_ingress","direct_action":true,"not_in_hw":true,
            "prog":{"id":42,"name":"ipq_tc_ingress","tag":"00","jited":1}}}]"#;
        assert_eq!(
            parse_tc_filters(json).unwrap(),
            vec![Attachment::Filter {
                prog_name: "ipq_tc_ingress".into(),
                priority: 18769,
                handle: 0x4951,
            }]
        );
        assert_eq!(parse_tc_filters("").unwrap(), vec![]);
    }
}
