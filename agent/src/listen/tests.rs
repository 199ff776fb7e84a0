use super::*;

#[test]
fn one_line_per_period_with_the_count_held_back() {
    let mut limit = RateLimited::new(Duration::from_secs(10));
    let t0 = Instant::now();
    assert_eq!(limit.allow(t0), Some(0));
    for i in 1..=500 {
        assert_eq!(limit.allow(t0 + Duration::from_millis(i)), None);
    }
    assert_eq!(limit.allow(t0 + Duration::from_secs(10)), Some(500));
    assert_eq!(limit.allow(t0 + Duration::from_secs(11)), None);
}

#[tokio::test]
async fn slots_run_out_and_come_back() {
    let mut guard = Guard::new("test", 2);
    let a = guard.admit().unwrap();
    let _b = guard.admit().unwrap();
    assert!(guard.admit().is_none());
    drop(a);
    assert!(guard.admit().is_some());
}

#[tokio::test]
async fn the_reserve_is_for_privileged_peers_only() {
    let mut guard = Guard::new("test", 2).with_reserve(1);
    let shared: Vec<_> = (0..2)
        .map(|_| guard.admit_reserving(false).unwrap())
        .collect();
    assert!(
        guard.admit_reserving(false).is_none(),
        "the shared slots are taken"
    );
    let reserved = guard.admit_reserving(true).expect("the reserved slot");
    assert!(
        guard.admit_reserving(true).is_none(),
        "the reserve is taken too"
    );
    drop(reserved);
    assert!(
        guard.admit_reserving(false).is_none(),
        "not for the unprivileged"
    );
    assert!(guard.admit_reserving(true).is_some());
    drop(shared);
    assert!(guard.admit_reserving(false).is_some());
}

#[tokio::test]
async fn one_peer_gets_its_allowance_and_leaves_the_rest_to_others() {
    let mut guard = Guard::with_peer_limit("test", 10, 3);
    let greedy: IpAddr = "192.0.2.7".parse().unwrap();
    let mut held: Vec<Admission> = (0..3).map(|_| guard.admit_from(greedy).unwrap()).collect();
    assert!(guard.admit_from(greedy).is_none(), "a fourth from one peer");
    // The same peer as IPv4-mapped IPv6 (a dual-stack listener) is the same peer.
    assert!(guard
        .admit_from("::ffff:192.0.2.7".parse().unwrap())
        .is_none());
    // Its refusals took no slot: the other 7 are there for everyone else.
    let others: Vec<Admission> = (0..7)
        .map(|i| {
            guard
                .admit_from(IpAddr::from([192, 0, 2, 100 + i]))
                .unwrap()
        })
        .collect();
    assert!(
        guard.admit_from("192.0.2.200".parse().unwrap()).is_none(),
        "all 10 taken"
    );
    held.pop();
    assert!(guard.admit_from(greedy).is_some(), "its slot came back");
    drop(held);
    drop(others);
    assert_eq!(
        guard.peers_open(),
        0,
        "no peer is remembered once its connections end"
    );
    assert!(guard.admit_from(greedy).is_some());
}

// On tokio's paused clock: the deadline and the slow reader's pauses are the clock's, so a
// busy machine cannot make the reader look stalled.
#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_fails_the_write_after_the_limit() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (ours, theirs) = tokio::io::duplex(64);
    let mut ours = WriteDeadline::new(ours, Duration::from_millis(100));
    let started = tokio::time::Instant::now();
    let err = ours.write_all(&[0u8; 4096]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(100));
    // A peer that reads keeps the connection going, however slowly in total.
    let (ours, mut theirs2) = tokio::io::duplex(64);
    let mut ours = WriteDeadline::new(ours, Duration::from_millis(100));
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut total = 0;
        while total < 4096 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            total += theirs2.read(&mut buf).await.unwrap();
        }
    });
    ours.write_all(&[0u8; 4096]).await.unwrap();
    reader.await.unwrap();
    drop(theirs);
}

#[test]
fn the_soft_fd_limit_reaches_the_hard_one() {
    let (_, new) = raise_fd_limit().unwrap();
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-parameter.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    assert_eq!((new, limit.rlim_cur), (limit.rlim_max, limit.rlim_max));
}
