//! The kernel the tests run on.

/// This kernel's version, from its release ("6.12.100+deb12-cloud-amd64" -> (6, 12)).
pub fn version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut parts = release.trim().split(['.', '-', '+']);
    let mut next = || parts.next().and_then(|p| p.parse().ok()).expect("version");
    (next(), next())
}
