//! ipq's cls_bpf filter on kernels without TCX: a clsact qdisc, and one direct-action filter
//! per hook at the fixed place `TC_FILTER_PRIORITY`/`TC_FILTER_HANDLE` (common/src/names.rs).
//!
//! aya creates and replaces the filter; this module reads the hook's filter list over a plain
//! (blocking) rtnetlink socket, so that ipq replaces or deletes only a filter it owns: a cls_bpf
//! filter at ipq's place whose program is one of ipq's (`ipq_` name). A filter of anyone else
//! at that place is reported and never touched.

use std::io;

use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};

use crate::paths::AttachPoint;
use rtnetlink::{
    packet_core::{
        NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
        NLM_F_ECHO, NLM_F_EXCL, NLM_F_REQUEST,
    },
    packet_route::{
        tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
        RouteNetlinkMessage,
    },
    sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr},
};

/// The prefix of every ipq program name: what makes a filter ipq's.
const IPQ_PROGRAM_PREFIX: &str = "ipq_";
/// `ETH_P_ALL` in network order: ipq's filter sees every protocol.
const ETH_P_ALL_BE: u16 = 0x0003u16.to_be();

/// Which clsact hook.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// The clsact hook of a TC attach point; `None` for XDP.
    pub const fn of(point: AttachPoint) -> Option<Self> {
        match point {
            AttachPoint::TcxIngress => Some(Self::Ingress),
            AttachPoint::TcxEgress => Some(Self::Egress),
            AttachPoint::Xdp => None,
        }
    }

    /// The hook a filter's parent names: `ffff:fff2` ingress, `ffff:fff3` egress.
    pub fn of_parent(parent: TcHandle) -> Option<Self> {
        [Self::Ingress, Self::Egress]
            .into_iter()
            .find(|d| d.parent() == parent)
    }

    fn parent(self) -> TcHandle {
        TcHandle {
            major: 0xffff,
            minor: match self {
                Self::Ingress => TcHandle::MIN_INGRESS,
                Self::Egress => TcHandle::MIN_EGRESS,
            },
        }
    }
}

/// One filter of a hook, as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub priority: u16,
    pub handle: u32,
    /// `bpf`, `u32`, `matchall`, ...
    pub kind: String,
    /// For a cls_bpf filter, its program's name (as `tc filter show` prints it).
    pub program: Option<String>,
    /// For a cls_bpf filter of an eBPF program, the program's id (`TCA_BPF_ID`): what
    /// [`super::cotenant`] runs to tell what the filter does with a packet.
    pub program_id: Option<u32>,
    /// A cls_bpf filter in direct-action mode: its program's return value is the verdict.
    pub direct_action: bool,
    /// A cls_bpf filter with actions of its own (`TCA_BPF_ACT`), or a classic BPF program
    /// (`TCA_BPF_OPS`, which has no program id): what it does is not its program's alone.
    pub opaque: bool,
}

impl Filter {
    /// Whether this filter sits at ipq's place (same priority; the handle, or the whole
    /// priority for a filter of another kind, which the kernel would refuse to share).
    pub fn at_ipq_place(&self) -> bool {
        self.priority == TC_FILTER_PRIORITY && (self.handle == TC_FILTER_HANDLE || self.handle == 0)
    }

    /// Whether this is ipq's own filter: cls_bpf at ipq's priority and handle, running an
    /// ipq program.
    pub fn is_ipq(&self) -> bool {
        self.priority == TC_FILTER_PRIORITY
            && self.handle == TC_FILTER_HANDLE
            && self.kind == "bpf"
            && self
                .program
                .as_deref()
                .is_some_and(|p| p.starts_with(IPQ_PROGRAM_PREFIX))
    }

    /// The filter a dump or a notification describes.
    pub fn from_message(tc: &TcMessage) -> Self {
        let mut filter = Filter {
            priority: (tc.header.info >> 16) as u16,
            handle: u32::from(tc.header.handle),
            kind: String::new(),
            program: None,
            program_id: None,
            direct_action: false,
            opaque: false,
        };
        for attr in &tc.attributes {
            match attr {
                TcAttribute::Kind(kind) => filter.kind.clone_from(kind),
                TcAttribute::Options(options) => {
                    for option in options {
                        let TcOption::Bpf(option) = option else {
                            continue;
                        };
                        match option {
                            TcFilterBpfOption::ProgName(name) => {
                                filter.program = Some(name.clone());
                            }
                            TcFilterBpfOption::ProgId(id) => filter.program_id = Some(*id),
                            TcFilterBpfOption::Flags(flags) => {
                                filter.direct_action = flags.contains(TcBpfFlags::DirectAction);
                            }
                            // TCA_BPF_ACT (1), TCA_BPF_OPS_LEN (4), TCA_BPF_OPS (5).
                            TcFilterBpfOption::Other(nla)
                                if matches!(rtnetlink::packet_core::Nla::kind(nla), 1 | 4 | 5) =>
                            {
                                filter.opaque = true;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        filter
    }

    pub fn describe(&self) -> String {
        format!(
            "{} filter pref {} handle {:#x}{}",
            self.kind,
            self.priority,
            self.handle,
            match (self.program.as_deref(), self.program_id) {
                (Some(p), Some(id)) => format!(" (program {p}, id {id})"),
                (Some(p), None) => format!(" (program {p})"),
                (None, _) => String::new(),
            }
        )
    }
}

/// A filter of `filters` (one hook's dump) that runs before ipq's: a lower priority, which
/// the kernel classifies first. The dump lists each priority's chain head (handle 0) beside
/// its filters; a filter with a handle describes it best.
pub fn ahead_of_ipq(filters: &[Filter]) -> Option<Filter> {
    let ahead = all_ahead_of_ipq(filters);
    ahead
        .iter()
        .find(|f| f.handle != 0)
        .or_else(|| ahead.first())
        .cloned()
}

/// Every filter of `filters` (one hook's dump) that runs before ipq's, in the order the kernel
/// classifies (priority, then the dump's order within a priority). A priority's chain head
/// (handle 0) is left out where a filter of that priority has a handle: it holds no program.
pub fn all_ahead_of_ipq(filters: &[Filter]) -> Vec<Filter> {
    let ahead = |f: &&Filter| f.priority != 0 && f.priority < TC_FILTER_PRIORITY && !f.is_ipq();
    let mut found: Vec<Filter> = filters.iter().filter(ahead).cloned().collect();
    let with_handle: std::collections::BTreeSet<u16> = found
        .iter()
        .filter(|f| f.handle != 0)
        .map(|f| f.priority)
        .collect();
    found.retain(|f| f.handle != 0 || !with_handle.contains(&f.priority));
    // Stable: within a priority, the dump's order stays.
    found.sort_by_key(|f| f.priority);
    found
}

/// What is at ipq's place on a hook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// Nothing: ipq creates its filter there.
    Free,
    /// ipq's own filter (from an earlier agent): replaced in place.
    Ipq,
    /// Someone else's filter: ipq refuses to touch it.
    Foreign(Filter),
}

/// Where ipq's filter would go on `ifindex`'s hook.
pub fn place(ifindex: u32, direction: Direction) -> io::Result<Place> {
    let filters = list(ifindex, direction)?;
    if filters.iter().any(Filter::is_ipq) {
        return Ok(Place::Ipq);
    }
    // The dump lists each priority's chain head with handle 0 and the kind of that priority.
    Ok(
        match filters
            .into_iter()
            .find(|f| f.at_ipq_place() && (f.handle != 0 || f.kind != "bpf"))
        {
            Some(foreign) => Place::Foreign(foreign),
            None => Place::Free,
        },
    )
}

fn request(message: RouteNetlinkMessage, flags: u16) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = 1;
    let mut msg = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    msg.finalize();
    msg
}

fn tc_message(ifindex: u32, direction: Direction) -> TcMessage {
    let mut message = TcMessage::default();
    message.header = TcHeader::default();
    message.header.index = ifindex as i32;
    message.header.parent = direction.parent();
    message
}

/// Sends `msg` and reads replies until the dump ends or the request is acknowledged; every
/// inner message is handed to `each`.
fn exchange(
    msg: NetlinkMessage<RouteNetlinkMessage>,
    mut each: impl FnMut(RouteNetlinkMessage),
) -> io::Result<()> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut buf = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut buf);
    socket.send(&buf, 0)?;
    let mut recv = vec![0u8; 64 * 1024];
    loop {
        let n = socket.recv(&mut &mut recv[..], 0)?;
        let mut offset = 0;
        while offset < n {
            let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&recv[offset..n])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let len = reply.header.length as usize;
            match reply.payload {
                NetlinkPayload::Done(_) => return Ok(()),
                NetlinkPayload::Error(e) => {
                    return match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    };
                }
                NetlinkPayload::InnerMessage(inner) => each(inner),
                _ => {}
            }
            if len == 0 {
                break;
            }
            offset += (len + 3) & !3;
        }
    }
}

/// Every filter on `ifindex`'s `direction` hook (none when the device has no clsact).
pub fn list(ifindex: u32, direction: Direction) -> io::Result<Vec<Filter>> {
    let msg = request(
        RouteNetlinkMessage::GetTrafficFilter(tc_message(ifindex, direction)),
        NLM_F_REQUEST | NLM_F_DUMP,
    );
    let mut filters = Vec::new();
    let result = exchange(msg, |inner| {
        if let RouteNetlinkMessage::NewTrafficFilter(tc) = inner {
            filters.push(Filter::from_message(&tc));
        }
    });
    match result {
        Ok(()) => Ok(filters),
        // No clsact (EINVAL) or no such device: nothing of ipq's there.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENODEV)) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Deletes ipq's filter from `ifindex`'s hook, if it is there and ipq's. Returns whether one
/// was deleted.
pub fn remove_ipq(ifindex: u32, direction: Direction) -> io::Result<bool> {
    if place(ifindex, direction)? != Place::Ipq {
        return Ok(false);
    }
    let mut message = tc_message(ifindex, direction);
    message.header.handle = TcHandle::from(TC_FILTER_HANDLE);
    message.header.info = (u32::from(TC_FILTER_PRIORITY) << 16) | u32::from(ETH_P_ALL_BE);
    message.attributes.push(TcAttribute::Kind("bpf".to_owned()));
    let msg = request(
        RouteNetlinkMessage::DelTrafficFilter(message),
        NLM_F_REQUEST | NLM_F_ACK,
    );
    match exchange(msg, |_| {}) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Adds a clsact qdisc to `ifindex` unless it has one. By index, over ipq's own socket, rather
/// than through aya's lookup of the name: that lookup reports a lack of file descriptors
/// (EMFILE) as ENOENT, which would hide the real cause of a failed attach. Returns false when
/// a qdisc already held the place: clsact, or a foreign one ([`ingress_qdisc`] tells).
pub fn add_clsact(ifindex: u32) -> io::Result<bool> {
    let mut message = TcMessage::default();
    message.header.index = ifindex as i32;
    message.header.handle = TcHandle {
        major: 0xffff,
        minor: 0,
    };
    message.header.parent = TcHandle::CLSACT;
    message
        .attributes
        .push(TcAttribute::Kind("clsact".to_owned()));
    let msg = request(
        RouteNetlinkMessage::NewQueueDiscipline(message),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    );
    match exchange(msg, |_| {}) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// What holds a device's ingress place (`ffff:`, parent `ffff:fff1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IngressQdisc {
    Clsact,
    /// No qdisc there (the kernel's placeholder `noop`, or none at all).
    Absent,
    /// Another kind (`ingress`): its one block takes filters for either hook.
    Foreign(String),
}

/// The qdisc at `ifindex`'s ingress place: one `RTM_GETQDISC` (a get, not a dump).
pub fn ingress_qdisc(ifindex: u32) -> io::Result<IngressQdisc> {
    let mut message = TcMessage::default();
    message.header.index = ifindex as i32;
    message.header.parent = TcHandle::CLSACT;
    let msg = request(
        RouteNetlinkMessage::GetQueueDiscipline(message),
        // The kernel answers a qdisc get as a notification (to RTNLGRP_TC): ECHO sends it to
        // this socket too. The ACK ends the exchange after it (a get sends no NLMSG_DONE).
        NLM_F_REQUEST | NLM_F_ECHO | NLM_F_ACK,
    );
    let mut kind = None;
    let result = exchange(msg, |inner| {
        if let RouteNetlinkMessage::NewQueueDiscipline(tc) = inner {
            kind = tc.attributes.iter().find_map(|a| match a {
                TcAttribute::Kind(k) => Some(k.clone()),
                _ => None,
            });
        }
    });
    match result {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(IngressQdisc::Absent),
        Err(e) => return Err(e),
    }
    Ok(match kind.as_deref() {
        Some("clsact") => IngressQdisc::Clsact,
        None | Some("noop" | "") => IngressQdisc::Absent,
        Some(other) => IngressQdisc::Foreign(other.to_owned()),
    })
}
