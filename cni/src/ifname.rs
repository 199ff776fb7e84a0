//! Interface names as the kernel takes them: what the plugins check of `CNI_IFNAME` and of
//! the host-side names in `prevResult` before they reach the kernel or the agent.

/// Whether the kernel accepts `name` as an interface name (`dev_valid_name`): 1 to 15 bytes
/// (IFNAMSIZ less its NUL), not `.` or `..`, no `/`, `:` or white space.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_as_the_kernel_takes_them() {
        for ok in ["eth0", "veth1234567890a", "a", "cali-x.y_z"] {
            assert!(valid_ifname(ok), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:1",
            "a b",
            "veth1234567890ab",
            &"x".repeat(100_000),
        ] {
            assert!(!valid_ifname(bad), "{bad}");
        }
    }
}
