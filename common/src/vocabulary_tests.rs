//! The vocabulary's derived forms: every variant, as strum lists it, keeps its spelling byte for
//! byte (metric label values, config values and API strings) and reads back from that spelling
//! and from its discriminant.

extern crate std;

use core::{fmt::Debug, str::FromStr};
use std::vec::Vec;

use strum::VariantArray;

use crate::{
    addr::AddrState,
    config::Mode,
    counters::{Action, Hook, Reason},
};

/// `all` is every variant in declaration order, each spelled as in `spellings` and read back
/// from that spelling and from its discriminant; one past the last discriminant is nothing.
fn assert_vocabulary<T>(all: &[T], spellings: &[&str], from_repr: fn(u32) -> Option<T>)
where
    T: VariantArray + Copy + PartialEq + Debug + Into<&'static str> + FromStr + Into<u32>,
{
    let spelled: Vec<&'static str> = all.iter().map(|v| (*v).into()).collect();
    assert_eq!(spelled, spellings);
    for (variant, name) in all.iter().zip(spellings) {
        assert_eq!(name.parse::<T>().ok(), Some(*variant), "{name} parses back");
        let raw: u32 = (*variant).into();
        assert_eq!(from_repr(raw), Some(*variant), "{variant:?} from {raw}");
    }
    let past_last = all.iter().map(|v| (*v).into()).max().unwrap_or(0) + 1;
    assert_eq!(from_repr(past_last), None);
    let upper = spellings[0].to_uppercase();
    assert!(upper.parse::<T>().is_err(), "{upper}: spellings are exact");
}

macro_rules! discriminant_into_u32 {
    ($($ty:ty),+) => {
        $(impl From<$ty> for u32 {
            fn from(value: $ty) -> u32 {
                value as u32
            }
        })+
    };
}
discriminant_into_u32!(AddrState, Mode, Hook, Reason, Action);

#[test]
fn addr_states() {
    assert_vocabulary(
        AddrState::VARIANTS,
        &["active", "draining", "quarantined"],
        AddrState::from_repr,
    );
    assert_eq!(AddrState::from_repr(0), None, "0 is no entry's state");
}

#[test]
fn modes() {
    assert_vocabulary(Mode::VARIANTS, &["enforce", "observe"], Mode::from_repr);
    for &mode in Mode::VARIANTS {
        assert_eq!(Mode::from_raw(mode as u32), mode);
        let wire = serde_json::to_value(mode).expect("serializes");
        assert_eq!(wire, mode.as_ref(), "serde and strum spell {mode:?} alike");
    }
    assert_eq!(
        Mode::from_raw(7),
        Mode::Enforce,
        "an unknown mode fails closed"
    );
}

#[test]
fn hooks() {
    assert_vocabulary(
        Hook::VARIANTS,
        &["tc_ingress", "tc_egress", "xdp"],
        Hook::from_repr,
    );
}

#[test]
fn reasons() {
    assert_vocabulary(
        Reason::VARIANTS,
        &[
            "fenced",
            "duplicate_source",
            "stale_traffic",
            "quarantined",
            "remote_claim",
        ],
        Reason::from_repr,
    );
}

#[test]
fn actions() {
    assert_vocabulary(
        Action::VARIANTS,
        &["dropped", "observed", "reported"],
        Action::from_repr,
    );
}
