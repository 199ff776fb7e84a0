//! Which addresses can belong to a workload. One predicate for every way an address reaches
//! the registry: netlink (neighbours, host routes) and claims through the API.

use std::net::IpAddr;

/// Why an address can never be a workload's.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr, strum::AsRefStr, strum::Display,
)]
#[strum(serialize_all = "kebab-case")]
pub enum NotWorkload {
    Unspecified,
    Loopback,
    Multicast,
    Broadcast,
    LinkLocal,
}

/// `Ok` for an address a workload can hold (unicast, not loopback, not link-local), else the
/// class that rules it out. An IPv4-mapped IPv6 address is judged as its IPv4 address.
pub fn workload_address(addr: IpAddr) -> Result<(), NotWorkload> {
    let class = match addr.to_canonical() {
        IpAddr::V4(a) if a.is_unspecified() => NotWorkload::Unspecified,
        IpAddr::V4(a) if a.is_loopback() => NotWorkload::Loopback,
        IpAddr::V4(a) if a.is_broadcast() => NotWorkload::Broadcast,
        IpAddr::V4(a) if a.is_multicast() => NotWorkload::Multicast,
        IpAddr::V4(a) if a.is_link_local() => NotWorkload::LinkLocal,
        IpAddr::V6(a) if a.is_unspecified() => NotWorkload::Unspecified,
        IpAddr::V6(a) if a.is_loopback() => NotWorkload::Loopback,
        IpAddr::V6(a) if a.is_multicast() => NotWorkload::Multicast,
        IpAddr::V6(a) if a.is_unicast_link_local() => NotWorkload::LinkLocal,
        _ => return Ok(()),
    };
    Err(class)
}

/// Whether a workload can hold `addr` (see [`workload_address`]).
pub fn is_workload_address(addr: IpAddr) -> bool {
    workload_address(addr).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_that_no_workload_holds_is_named() {
        for (addr, class) in [
            ("0.0.0.0", NotWorkload::Unspecified),
            ("::", NotWorkload::Unspecified),
            ("127.0.0.1", NotWorkload::Loopback),
            ("127.255.0.9", NotWorkload::Loopback),
            ("::1", NotWorkload::Loopback),
            ("::ffff:127.0.0.1", NotWorkload::Loopback),
            ("224.0.0.1", NotWorkload::Multicast),
            ("239.1.2.3", NotWorkload::Multicast),
            ("ff02::1", NotWorkload::Multicast),
            ("255.255.255.255", NotWorkload::Broadcast),
            ("169.254.1.1", NotWorkload::LinkLocal),
            ("fe80::1", NotWorkload::LinkLocal),
        ] {
            let addr: IpAddr = addr.parse().unwrap();
            assert_eq!(workload_address(addr), Err(class), "{addr}");
            assert!(!is_workload_address(addr), "{addr}");
        }
        for ok in [
            "10.0.0.1",
            "192.168.1.255",
            "100.64.0.1",
            "fd00::1",
            "2001:db8::1",
        ] {
            assert!(is_workload_address(ok.parse().unwrap()), "{ok}");
        }
    }
}
