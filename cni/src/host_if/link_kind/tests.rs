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

/// A kernel answer of `kind` whose body is `body`.
fn answer(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::new();
    msg.extend_from_slice(&((NLMSG_HEADER + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&[0u8; 10]);
    msg.extend_from_slice(body);
    msg
}

#[test]
fn an_answer_that_names_no_kind_says_why_in_the_same_words() {
    let refused = parse(&answer(
        libc::NLMSG_ERROR as u16,
        &(-libc::EPERM).to_ne_bytes(),
    ));
    assert_eq!(refused, Err(LinkKindError::Refused { errno: libc::EPERM }));
    assert_eq!(
        refused.unwrap_err().to_string(),
        io::Error::from_raw_os_error(libc::EPERM).to_string()
    );
    let missing = parse(&answer(
        libc::NLMSG_ERROR as u16,
        &(-libc::ENODEV).to_ne_bytes(),
    ));
    assert_eq!(missing, Ok(LinkKind::Missing));
    let other = parse(&answer(libc::RTM_NEWADDR, &[0u8; IFINFOMSG]));
    assert_eq!(
        other,
        Err(LinkKindError::UnexpectedType {
            kind: libc::RTM_NEWADDR
        })
    );
    assert_eq!(other.unwrap_err().to_string(), "an answer of type 20");
    let cut = parse(&new_link(b"bridge\0")[..20]);
    assert_eq!(cut, Err(LinkKindError::Malformed { len: 20 }));
    assert_eq!(
        cut.unwrap_err().to_string(),
        "a malformed answer of 20 bytes"
    );
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
