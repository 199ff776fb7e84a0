use super::*;

/// A kernel answer: `RTM_NEWLINK` with `IFLA_LINKINFO` { `IFLA_INFO_KIND` = `kind` }.
fn new_link(kind: &[u8]) -> Vec<u8> {
    let attr = |kind: u16, payload: &[u8]| {
        let mut a = Vec::new();
        a.extend_from_slice(&((RTATTR_HEADER + payload.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(payload);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    };
    let info = attr(IFLA_INFO_KIND, kind);
    // NLA_F_NESTED set, as the kernel sends it.
    let linkinfo = attr(libc::IFLA_LINKINFO | 0x8000, &info);
    let ifname = attr(libc::IFLA_IFNAME, b"cni0\0");
    let total = NLMSG_HEADER + IFINFOMSG + ifname.len() + linkinfo.len();
    let mut msg = Vec::new();
    msg.extend_from_slice(&(total as u32).to_ne_bytes());
    msg.extend_from_slice(&libc::RTM_NEWLINK.to_ne_bytes());
    msg.extend_from_slice(&[0u8; 10]);
    msg.extend_from_slice(&[0u8; IFINFOMSG]);
    msg.extend_from_slice(&ifname);
    msg.extend_from_slice(&linkinfo);
    msg
}

#[test]
fn the_link_info_kind_says_bridge() {
    assert_eq!(parse(&new_link(b"bridge\0")), Ok(LinkKind::Bridge));
    assert_eq!(parse(&new_link(b"veth\0")), Ok(LinkKind::Other));
    assert_eq!(parse(&new_link(b"bridge_slave\0")), Ok(LinkKind::Other));
}

#[test]
fn the_request_names_the_interface_and_is_padded() {
    let msg = request("veth1");
    assert_eq!(msg.len(), 16 + 16 + 12);
    assert_eq!(u32_at(&msg, 0), Some(44));
    assert_eq!(u16_at(&msg, 4), Some(libc::RTM_GETLINK));
    assert_eq!(&msg[36..42], b"veth1\0");
}

#[test]
fn loopback_is_not_a_bridge_and_nonsense_is_missing() {
    assert_eq!(link_kind("lo").unwrap(), LinkKind::Other);
    assert_eq!(link_kind("ipq-no-such0").unwrap(), LinkKind::Missing);
}
