//! Whether an interface of the current network namespace is a bridge: one RTM_GETLINK by name
//! on a netlink socket of our own, its `IFLA_LINKINFO`/`IFLA_INFO_KIND` read by hand. The
//! plugin asks this once per host-side interface of an ADD; a request this small does not
//! justify linking the netlink crates (and their async runtime) into every plugin binary.
//! A lookup by name never makes the kernel load a module, as the `SIOC*` ioctls on a missing
//! interface do.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use thiserror::Error;

use crate::error::{code, CniError};

/// What the kernel says of one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkKind {
    Bridge,
    Other,
    /// No such interface in this namespace (the agent will say so when claiming).
    Missing,
}

const NLMSG_HEADER: usize = 16;
const IFINFOMSG: usize = 16;
const RTATTR_HEADER: usize = 4;
const IFLA_INFO_KIND: u16 = 1;
/// Large enough for any link message of a veth or a bridge (a few hundred bytes of
/// attributes, statistics included); a truncated answer is reported, not misread.
const ANSWER_BUF: usize = 32 * 1024;

/// Why the kernel's answer names no kind of link (its words go into the plugin's error).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LinkKindError {
    #[error("a malformed answer of {len} bytes")]
    Malformed { len: usize },
    /// The kernel refused the lookup with this errno (other than `ENODEV`: no such link).
    #[error("{}", io::Error::from_raw_os_error(*errno))]
    Refused { errno: i32 },
    #[error("an answer of type {kind}")]
    UnexpectedType { kind: u16 },
}

fn netlink_error(what: impl std::fmt::Display) -> CniError {
    CniError::new(code::INTERNAL, format!("netlink: {what}"))
}

/// What the kernel says of `name` (a valid interface name, checked before).
pub(super) fn link_kind(name: &str) -> Result<LinkKind, CniError> {
    let socket = open()?;
    send(&socket, &request(name)).map_err(|e| netlink_error(format!("asking for {name}: {e}")))?;
    let mut answer = vec![0u8; ANSWER_BUF];
    // SAFETY: `answer` is writable for its whole length.
    let len = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            answer.as_mut_ptr().cast(),
            answer.len(),
            libc::MSG_TRUNC,
        )
    };
    if len < 0 {
        let err = io::Error::last_os_error();
        return Err(netlink_error(format!("looking up {name}: {err}")));
    }
    let len = len as usize;
    if len > answer.len() {
        return Err(netlink_error(format!(
            "looking up {name}: an answer of {len} bytes"
        )));
    }
    parse(&answer[..len]).map_err(|e| netlink_error(format!("looking up {name}: {e}")))
}

fn open() -> Result<OwnedFd, CniError> {
    // SAFETY: a plain socket call; the descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(netlink_error(io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn send(socket: &OwnedFd, message: &[u8]) -> io::Result<()> {
    // SAFETY: all zeroes is a valid sockaddr_nl: the kernel (port 0), no groups.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `message` and `kernel` are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
            (&raw const kernel).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// RTM_GETLINK of the interface named `name`: header, an empty `ifinfomsg` (index 0: by name),
/// and `IFLA_IFNAME` with its NUL, padded to 4 bytes.
fn request(name: &str) -> Vec<u8> {
    let attr_len = RTATTR_HEADER + name.len() + 1;
    let total = NLMSG_HEADER + IFINFOMSG + attr_len.next_multiple_of(4);
    let mut msg = Vec::with_capacity(total);
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    msg.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel assigns it
    msg.extend_from_slice(&[0u8; IFINFOMSG]);
    msg.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    msg.extend_from_slice(&libc::IFLA_IFNAME.to_ne_bytes());
    msg.extend_from_slice(name.as_bytes());
    msg.resize(total, 0);
    msg
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The attributes of `bytes`, each as (type without its flags, payload).
fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(bytes, 0)?);
        let kind = u16_at(bytes, 2)? & libc::NLA_TYPE_MASK as u16;
        let payload = bytes.get(RTATTR_HEADER..len)?;
        bytes = bytes.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, payload))
    })
}

/// The kind of link the kernel's answer describes, or why the answer is none.
fn parse(answer: &[u8]) -> Result<LinkKind, LinkKindError> {
    let malformed = || LinkKindError::Malformed { len: answer.len() };
    let len = u32_at(answer, 0).ok_or_else(malformed)? as usize;
    let kind = u16_at(answer, 4).ok_or_else(malformed)?;
    let body = answer.get(NLMSG_HEADER..len).ok_or_else(malformed)?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = -(u32_at(body, 0).ok_or_else(malformed)? as i32);
        return match errno {
            libc::ENODEV => Ok(LinkKind::Missing),
            _ => Err(LinkKindError::Refused { errno }),
        };
    }
    if kind != libc::RTM_NEWLINK {
        return Err(LinkKindError::UnexpectedType { kind });
    }
    let attrs = body.get(IFINFOMSG..).ok_or_else(malformed)?;
    let bridge = attributes(attrs)
        .filter(|(kind, _)| *kind == libc::IFLA_LINKINFO)
        .flat_map(|(_, info)| attributes(info))
        .any(|(kind, value)| {
            kind == IFLA_INFO_KIND && value.strip_suffix(b"\0") == Some(b"bridge")
        });
    Ok(if bridge {
        LinkKind::Bridge
    } else {
        LinkKind::Other
    })
}

#[cfg(test)]
mod tests;
