//! A MAC address as the API spells it (`aa:bb:cc:dd:ee:ff`): the claim's `mac` field, which
//! ipq-cni checks before it sends it and the agent checks again when it takes it.

/// `aa:bb:cc:dd:ee:ff` → its six bytes.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

pub fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x77, 0, 0, 0x0b, 0x02];

    #[test]
    fn macs_parse_strictly() {
        assert_eq!(parse_mac("02:77:00:00:0b:02"), Some(MAC));
        assert_eq!(format_mac(MAC), "02:77:00:00:0b:02");
        for bad in [
            "",
            "02:77:00:00:0b",
            "02:77:00:00:0b:02:03",
            "2:77:0:0:b:2",
            "zz:77:00:00:0b:02",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }
}
