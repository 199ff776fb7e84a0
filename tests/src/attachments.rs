//! What is attached to an interface's TC and XDP hooks, whichever way it was attached: TCX
//! links (kernels from 6.6, or with TCX backported), cls_bpf filters on a clsact qdisc over
//! netlink (older kernels), and the XDP program. Tests use it to check that ipq has exactly
//! one attachment per hook, also after an agent restart, and which one it is.

use std::process::Command;

use anyhow::{bail, Context as _};
use aya::programs::links::LinkError;
use aya::programs::{loaded_links, loaded_programs, ProgramError, SchedClassifier, TcAttachType};
use aya::sys::SyscallError;
use ipq_common::names;

use crate::lab::ifindex;
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
///
/// The filters are read first: ipq moves a hook from its filter to a TCX link by creating the
/// link before it deletes the filter, so in this order a hook being moved meanwhile is never
/// seen with neither (it may be seen with both).
pub fn tc(ns: &NetNs, ifname: &str, attach: TcAttachType) -> anyhow::Result<Vec<Attachment>> {
    let filters = tc_filters(ns, ifname, attach)?;
    let mut found = tcx(ns, ifname, attach)?;
    found.extend(filters);
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
    let index = ifindex(ns, ifname)?;
    programs
        .iter()
        .map(|p| {
            Ok(Attachment::Tcx {
                prog_name: p.name_as_str().unwrap_or("?").to_owned(),
                link: link_of(p.id(), index)?,
            })
        })
        .collect()
}

/// The id of the bpf_link that attaches program `prog_id` to interface `ifindex` (of the
/// namespace the caller looked the index up in), if any. The same program may be linked to
/// many interfaces, so the program alone does not name the link.
fn link_of(prog_id: u32, ifindex: u32) -> anyhow::Result<Option<u32>> {
    for link in loaded_links() {
        let link = match link {
            Ok(link) => link,
            Err(LinkError::SyscallError(e)) if vanished(&e) => continue,
            Err(e) => return Err(e).context("listing bpf links"),
        };
        if link.program_id() == prog_id && link_ifindex(link.id())? == Some(ifindex) {
            return Ok(Some(link.id()));
        }
    }
    Ok(None)
}

/// Whether listing a bpf object failed because it went away between the kernel naming its id
/// and the listing opening it: other tests (and agents) detach and unload all the time, and
/// such an object is simply not there any more.
fn vanished(e: &SyscallError) -> bool {
    e.io_error.raw_os_error() == Some(libc::ENOENT)
}

/// The interface index of a TCX or XDP link (the first field of both kinds' part of
/// `struct bpf_link_info`), read with the bpf syscall: aya's `LinkInfo` does not expose it.
/// None if the link is gone or of another kind.
fn link_ifindex(link_id: u32) -> anyhow::Result<Option<u32>> {
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
    const BPF_LINK_TYPE_XDP: u32 = 6;
    const BPF_LINK_TYPE_TCX: u32 = 11;
    /// `struct bpf_link_info`: type, id, prog_id, then the per-kind union at offset 16.
    #[repr(C)]
    struct LinkInfo {
        kind: u32,
        id: u32,
        prog_id: u32,
        _pad: u32,
        union: [u32; 16],
    }
    // `union bpf_attr`, zeroed beyond what each command reads (the kernel checks that).
    let mut attr = [0u32; 32];
    attr[0] = link_id;
    // SAFETY: a valid bpf_attr of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_GET_FD_BY_ID,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        bail!("BPF_LINK_GET_FD_BY_ID {link_id}: {err}");
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // SAFETY: plain old data.
    let mut info: LinkInfo = unsafe { std::mem::zeroed() };
    let mut attr = [0u64; 16];
    attr[0] = std::os::fd::AsRawFd::as_raw_fd(&fd) as u64
        | ((std::mem::size_of::<LinkInfo>() as u64) << 32);
    attr[1] = &mut info as *mut LinkInfo as u64;
    // SAFETY: bpf_attr.info {bpf_fd, info_len, info} pointing at `info`, which outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if rc < 0 {
        bail!(
            "BPF_OBJ_GET_INFO_BY_FD of link {link_id}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(matches!(info.kind, BPF_LINK_TYPE_TCX | BPF_LINK_TYPE_XDP).then_some(info.union[0]))
}

/// The name of loaded program `id`.
fn prog_name(id: u32) -> anyhow::Result<String> {
    for program in loaded_programs() {
        let program = match program {
            Ok(program) => program,
            Err(ProgramError::SyscallError(e)) if vanished(&e) => continue,
            Err(e) => return Err(e).context("listing bpf programs"),
        };
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
        link: link_of(id, ifindex(ns, ifname)?)?,
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
