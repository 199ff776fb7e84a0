use std::net::IpAddr;

use super::*;
use crate::api::model::ClaimRequest;

#[test]
fn a_bad_address_in_a_body_is_named_with_its_field() {
    let body = br#"{"addresses":["10.0.0.1","10.0.0.300"],"holder":{"interface":"veth1"}}"#;
    let err = decode::<ClaimRequest>(body, "POST /v1/claims").unwrap_err();
    assert_eq!(err.code(), ErrorCode::BadRequest);
    assert!(err.0.message.contains("addresses[1]"), "{}", err.0.message);
    assert!(
        err.0.message.contains("POST /v1/claims"),
        "{}",
        err.0.message
    );
}

#[test]
fn unknown_fields_and_trailing_garbage_are_refused() {
    let unknown = br#"{"addresses":["10.0.0.1"],"holder":{"interface":"v","colour":1}}"#;
    let err = decode::<ClaimRequest>(unknown, "x").unwrap_err();
    assert!(err.0.message.contains("colour"), "{}", err.0.message);
    let trailing = br#"{"addresses":["10.0.0.1"],"holder":{"interface":"v"}} {}"#;
    assert!(decode::<ClaimRequest>(trailing, "x").is_err());
    assert!(decode::<ClaimRequest>(b"", "x").is_err());
}

#[test]
fn query_parameters_are_checked() {
    let q = Query::parse("state=active").unwrap();
    assert!(q.allow(&["state"]).is_ok());
    assert_eq!(q.get("state"), Some("active"));
    let err = Query::parse("stat=active")
        .unwrap()
        .allow(&["state"])
        .unwrap_err();
    assert!(err.0.message.contains("`stat`"), "{}", err.0.message);
    assert!(Query::parse("a=1&a=2").is_err());
    assert!(parse_state("free").is_err());
    assert_eq!(
        parse_ip("::ffff:10.0.0.1").unwrap(),
        "10.0.0.1".parse::<IpAddr>().unwrap()
    );
    assert!(parse_ip("10.0.0")
        .unwrap_err()
        .0
        .message
        .contains("`10.0.0`"));
}

#[test]
fn reads_are_everyones_changes_the_admins_and_ipam_roots() {
    let get = |path: &[&str]| role_needed(&Method::GET, path);
    for path in [
        &["status"][..],
        &["addresses"],
        &["addresses", "10.0.0.1"],
        &["conflicts"],
        &["events"],
    ] {
        assert_eq!(get(path), Role::Read, "{path:?}");
    }
    for (method, path) in [
        (Method::POST, &["claims"][..]),
        (Method::POST, &["drains"]),
        (Method::POST, &["addresses", "10.0.0.1", "drain"]),
        (Method::POST, &["addresses", "10.0.0.1", "release"]),
        (Method::POST, &["gc"]),
        (Method::PUT, &["datapath", "10.0.0.1"]),
        (Method::DELETE, &["datapath", "10.0.0.1"]),
    ] {
        assert_eq!(role_needed(&method, path), Role::Admin, "{method} {path:?}");
    }
    for path in [
        &["ipam", "releases"][..],
        &["ipam", "allocations"],
        &["ipam", "exhausted"],
    ] {
        assert_eq!(role_needed(&Method::POST, path), Role::Root, "{path:?}");
        assert_eq!(get(path), Role::Root, "GET {path:?}");
    }
}

#[test]
fn only_root_may_ask_for_a_delegate_run_as_root() {
    assert!(require(Peer::root(), Role::Root, "POST /v1/ipam/releases").is_ok());
    let admin = Peer {
        uid: 65534,
        role: Role::Admin,
        not_root: None,
    };
    let err = require(admin, Role::Root, "POST /v1/ipam/releases").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Forbidden);
    assert_eq!(err.0.needs, Some(Role::Root));
    for needed in ["uid 65534", "root role", "POST /v1/ipam/releases"] {
        assert!(
            err.0.message.contains(needed),
            "{needed}: {}",
            err.0.message
        );
    }
}
