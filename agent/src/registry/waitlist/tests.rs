use std::net::IpAddr;

use super::Waitlist;
use crate::registry::Holder;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn claimants_come_back_oldest_first_and_forgotten_ones_never() {
    let mut pending = Waitlist::default();
    assert!(pending.push(ip("10.0.0.1"), Holder::new(3, "veth3")));
    assert!(pending.push(ip("10.0.0.2"), Holder::new(4, "veth4")));
    assert!(pending.push(ip("10.0.0.3"), Holder::new(5, "veth5")));
    assert!(!pending.push(ip("10.0.0.1"), Holder::new(3, "veth3")));
    assert_eq!(pending.len(), 3);
    pending.forget(ip("10.0.0.2"), 4);
    assert_eq!(pending.len(), 2);
    assert_eq!(pending.pop().map(|(a, _)| a), Some(ip("10.0.0.1")));
    pending.forget_interface(5);
    assert_eq!(pending.pop(), None);
    assert_eq!(pending.len(), 0);
}

#[test]
fn past_the_bound_claimants_are_counted_not_kept() {
    let mut pending = Waitlist::with_bound(1);
    pending.push(ip("10.0.0.1"), Holder::new(3, "veth3"));
    pending.push(ip("10.0.0.2"), Holder::new(4, "veth4"));
    assert_eq!(pending.len(), 2);
    assert!(pending.overflowed());
    assert_eq!(pending.pop().map(|(a, _)| a), Some(ip("10.0.0.1")));
    assert_eq!(pending.pop(), None);
    pending.clear_overflow();
    assert_eq!(pending.len(), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Push(u8, u32),
    PushFront(u8, u32),
    Pop,
    Forget(u8, u32),
    ForgetInterface(u32),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0..4u8, 1..4u32).prop_map(|(a, i)| Op::Push(a, i)),
        (0..4u8, 1..4u32).prop_map(|(a, i)| Op::PushFront(a, i)),
        Just(Op::Pop),
        (0..4u8, 1..4u32).prop_map(|(a, i)| Op::Forget(a, i)),
        (1..4u32).prop_map(Op::ForgetInterface),
    ]
}

proptest::proptest! {
    /// The interface index lists exactly the waiting claimants, whatever came and went, and
    /// an interface forgotten never comes back out of the queue.
    #[test]
    fn the_interface_index_follows_every_operation(
        ops in proptest::collection::vec(op(), 0..60)
    ) {
        let mut pending = Waitlist::with_bound(6);
        let addr = |a: u8| IpAddr::from([10, 0, 0, a]);
        for op in ops {
            match op {
                Op::Push(a, i) => {
                    pending.push(addr(a), Holder::new(i, format!("veth{i}")));
                }
                Op::PushFront(a, i) => {
                    pending.push_front(addr(a), Holder::new(i, format!("veth{i}")));
                }
                Op::Pop => {
                    pending.pop();
                }
                Op::Forget(a, i) => pending.forget(addr(a), i),
                Op::ForgetInterface(i) => {
                    pending.forget_interface(i);
                    proptest::prop_assert!(pending.holders.keys().all(|(_, j)| *j != i));
                }
            }
            if let Err(problem) = pending.check_index() {
                return Err(proptest::test_runner::TestCaseError::fail(problem.to_string()));
            }
        }
    }
}
