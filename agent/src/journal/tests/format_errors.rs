//! The format's errors: each kind of damage is told apart, in the words that a corrupt
//! journal's reason (shown in `/v1/status`) has always used.

use crate::journal::format::{self, FormatError, Header, FORMAT, VERSION, VERSION_SNAPSHOT};

fn header(format: &str, version: u32) -> Header {
    Header {
        format: format.to_owned(),
        version,
        boot_id: None,
        written_mono_ns: 0,
        written_unix_ms: 0,
        body_len: None,
        body_fnv64: None,
    }
}

#[test]
fn a_line_that_does_not_check_out_says_why() {
    let mut framed = Vec::new();
    format::frame(b"{}", &mut framed);
    let line = framed.strip_suffix(b"\n").unwrap();
    assert_eq!(format::unframe(line).unwrap(), b"{}");

    let short = format::unframe(b"{}");
    assert!(
        matches!(short, Err(FormatError::MalformedLine)),
        "{short:?}"
    );
    let not_hex = format::unframe(b"zzzzzzzzzzzzzzzz {}");
    assert!(
        matches!(not_hex, Err(FormatError::MalformedChecksum)),
        "{not_hex:?}"
    );
    let mut flipped = line.to_vec();
    *flipped.last_mut().unwrap() = b']';
    let mismatch = format::unframe(&flipped).unwrap_err();
    assert!(matches!(mismatch, FormatError::ChecksumMismatch));
    assert_eq!(mismatch.to_string(), "checksum mismatch");
}

#[test]
fn a_header_of_another_format_or_version_is_refused_in_the_same_words() {
    assert!(format::check_header(&header(FORMAT, VERSION), VERSION).is_ok());
    let other = format::check_header(&header("other", VERSION), VERSION).unwrap_err();
    assert_eq!(other.to_string(), r#"not an ipq journal (format "other")"#);
    let version = format::check_header(&header(FORMAT, 7), VERSION).unwrap_err();
    assert!(matches!(version, FormatError::Version { found: 7 }));
    assert_eq!(
        version.to_string(),
        format!(
            "journal version 7 is not a version this agent reads ({VERSION_SNAPSHOT} or \
             {VERSION})"
        )
    );
}

#[test]
fn a_version_1_file_is_checked_against_its_header() {
    let body = br#"{"version":1,"records":[]}"#;
    let mut with_body = header(FORMAT, VERSION_SNAPSHOT);
    with_body.body_len = Some(body.len());
    with_body.body_fnv64 = Some(format::fnv64(body));
    let file = |header: &Header, body: &[u8]| {
        let mut bytes = serde_json::to_vec(header).unwrap();
        bytes.push(b'\n');
        bytes.extend_from_slice(body);
        bytes.push(b'\n');
        bytes
    };
    let whole = file(&with_body, body);
    let (_, read) = format::v1_body(&whole).unwrap();
    assert_eq!(read, body);

    let cut = format::v1_body(&file(&with_body, &body[..10])).unwrap_err();
    assert!(
        matches!(cut, FormatError::Truncated { body: 10, stated } if stated == body.len()),
        "{cut:?}"
    );
    assert_eq!(
        cut.to_string(),
        format!("truncated: body has 10 bytes, header says {}", body.len())
    );
    let bare = format::v1_body(&file(&header(FORMAT, VERSION_SNAPSHOT), body)).unwrap_err();
    assert_eq!(bare.to_string(), "header: no body length or checksum");
    let no_line = format::v1_body(b"{").unwrap_err();
    assert!(matches!(no_line, FormatError::NoHeaderLine), "{no_line:?}");
    let garbled = format::v1_body(b"{\n").unwrap_err();
    assert!(matches!(garbled, FormatError::Header(_)), "{garbled:?}");
    assert!(garbled.to_string().starts_with("header: "), "{garbled}");
}
