//! The names a CNI runtime hands a plugin, as the spec defines them: what the agent accepts in
//! a held release before it stores the release, runs a delegate with it, or makes a metric
//! label of it.

/// Longest container id accepted: the spec sets no bound, runtimes use 64 hex digits.
pub const MAX_CONTAINER_ID: usize = 256;
/// Longest network name accepted: the spec sets no bound; host-local makes a directory of it.
pub const MAX_NETWORK_NAME: usize = 128;

/// Why a name is refused, for a 400 naming the field.
pub type Refusal = &'static str;

/// The spec's container id (and network name) characters: an alphanumeric first, then
/// letters, digits, `_`, `.` and `-`.
fn spec_name(name: &str, max: usize) -> Result<(), Refusal> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > max {
        return Err("too long");
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("must start with a letter or digit (the CNI spec's rule)");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        return Err(
            "holds a character other than letters, digits, '_', '.' and '-' (the CNI \
                    spec's rule)",
        );
    }
    Ok(())
}

/// `CNI_CONTAINERID` as the spec defines it, at most [`MAX_CONTAINER_ID`] bytes.
pub fn check_container_id(id: &str) -> Result<(), Refusal> {
    spec_name(id, MAX_CONTAINER_ID)
}

/// A network's `name` as the spec defines it, at most [`MAX_NETWORK_NAME`] bytes.
pub fn check_network_name(name: &str) -> Result<(), Refusal> {
    spec_name(name, MAX_NETWORK_NAME)
}

/// `CNI_IFNAME` as the kernel takes an interface name (`dev_valid_name`): 1 to 15 bytes, not
/// `.` or `..`, no `/`, `:`, white space or NUL.
pub fn check_ifname(name: &str) -> Result<(), Refusal> {
    if name.is_empty() || name.len() > 15 {
        return Err("must be 1 to 15 bytes (an interface name)");
    }
    if name == "." || name == ".." {
        return Err("`.` and `..` name no interface");
    }
    if name
        .chars()
        .any(|c| matches!(c, '/' | ':' | '\0') || c.is_whitespace())
    {
        return Err("holds '/', ':', white space or NUL, which no interface name may");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_and_networks_as_the_spec_defines_them() {
        for good in ["c0ffee", "a", "pod_1.x-y", &"f".repeat(64)] {
            assert!(check_container_id(good).is_ok(), "{good}");
            assert!(check_network_name(good).is_ok(), "{good}");
        }
        let long_id = "a".repeat(MAX_CONTAINER_ID + 1);
        let long_net = format!("n{}\n", "x".repeat(10 * 1024));
        for bad in [
            "",
            "-x",
            ".x",
            "a\0b",
            "../../../../etc/passwd",
            "a b",
            "a/b",
            "h\u{e9}",
            &long_id,
            &long_net,
        ] {
            assert!(check_container_id(bad).is_err(), "{bad:?}");
            assert!(check_network_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_network_name(&"n".repeat(MAX_NETWORK_NAME + 1)).is_err());
    }

    #[test]
    fn interface_names_as_the_kernel_takes_them() {
        for good in ["eth0", "net1", "veth1234567890a", "cali-x.y_z"] {
            assert!(check_ifname(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:1",
            "a b",
            "e\0",
            "veth1234567890ab",
        ] {
            assert!(check_ifname(bad).is_err(), "{bad:?}");
        }
    }
}
