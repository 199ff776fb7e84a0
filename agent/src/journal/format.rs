//! The journal's bytes.
//!
//! Version 2 (written): one record per line, each line `<fnv64 of the JSON, 16 hex digits>
//! <JSON>\n` (JSON never holds a raw newline). The first line is the [`Header`]; then come base
//! lines (`{"put":[...]}`, the registry as a compaction found it, in chunks) and one batch line
//! per commit (`{"m":..,"u":..,"put":[...],"del":[...]}`: whole records of the keys that
//! changed, and the keys that went). A line is atomic: it checks out whole or not at all, so a
//! commit lands whole or not at all.
//!
//! Version 1 (read, for upgrades): a header line (JSON with the body's length and checksum) and
//! one body line, the registry snapshot. It starts with `{`, a version 2 file with a hex digit.
//!
//! What every version keeps, whatever else changes: the first line is a JSON object with
//! `format` and `version`, after a 16-hex-digit checksum and a space (version 2 on) or alone
//! (version 1). That is how an agent recognises a file that a newer agent wrote
//! ([`newer_version`]) and, after a rollback, leaves it untouched for that agent instead of
//! calling it corrupt; it journals to [`beside_file`] meanwhile. A format that breaks this
//! contract must use another file name.
//!
//! When [`VERSION`] is raised, the newer agent must also read the file an older agent kept
//! beside its own (`registry.journal.v<older>`) when that was written after its own (what the
//! older agent did after a rollback), then remove it.

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub const FORMAT: &str = "ipq-journal";
pub const VERSION: u32 = 2;
/// The full-snapshot format of earlier agents.
pub const VERSION_SNAPSHOT: u32 = 1;
/// Records per base line: a compaction streams the registry instead of building one huge line.
pub const BASE_CHUNK: usize = 512;

/// The name of the file this agent journals to while a newer agent's journal is in place.
pub fn beside_file() -> String {
    format!("{}.v{VERSION}", super::JOURNAL_FILE)
}

/// The version of a file whose first line (without its newline) says it is an ipq journal of
/// a newer format than this agent's; `None` for anything else. Only the contract above is
/// read: the checksum is not checked, since a newer format may frame lines differently.
pub fn newer_version(first_line: &[u8]) -> Option<u32> {
    #[derive(Deserialize)]
    struct Identity {
        format: String,
        version: u32,
    }
    let json = match first_line.get(..17) {
        Some([hex @ .., b' ']) if hex.iter().all(u8::is_ascii_hexdigit) => &first_line[17..],
        _ => first_line,
    };
    let identity: Identity = serde_json::from_slice(json).ok()?;
    (identity.format == FORMAT && identity.version > VERSION).then_some(identity.version)
}

pub fn fnv64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The first line of a file: which boot its monotonic stamps belong to.
#[derive(Debug, Serialize, Deserialize)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub boot_id: Option<String>,
    pub written_mono_ns: u64,
    pub written_unix_ms: u64,
    /// Version 1 only: the body's length and checksum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_len: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_fnv64: Option<u64>,
}

/// A base or batch line: records written whole, and keys removed.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound(deserialize = "E: serde::de::DeserializeOwned, K: serde::de::DeserializeOwned"))]
pub struct Line<E, K> {
    /// Monotonic ns and Unix ms at the commit (batches only): the latest clock pair, which
    /// carries the deadlines across a reboot most precisely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub u: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub put: Vec<E>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub del: Vec<K>,
}

/// Appends one framed line holding `json` to `out`.
pub fn frame(json: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("{:016x} ", fnv64(json)).as_bytes());
    out.extend_from_slice(json);
    out.push(b'\n');
}

/// Why bytes are not a journal this agent reads. The words end up in the journal's `Corrupt`
/// reason, which `/v1/status` shows and operators read: keep them.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("malformed line")]
    MalformedLine,
    #[error("malformed checksum")]
    MalformedChecksum,
    #[error("checksum mismatch")]
    ChecksumMismatch,
    #[error("no header line")]
    NoHeaderLine,
    #[error("header: {0}")]
    Header(#[source] serde_json::Error),
    #[error("header: no body length or checksum")]
    NoBodyLength,
    #[error("truncated: body has {body} bytes, header says {stated}")]
    Truncated { body: usize, stated: usize },
    #[error("not an ipq journal (format {0:?})")]
    NotIpq(String),
    #[error(
        "journal version {found} is not a version this agent reads ({snapshot} or {current})",
        snapshot = VERSION_SNAPSHOT,
        current = VERSION
    )]
    Version { found: u32 },
}

/// The JSON of one framed line (without its newline), or why it does not check out.
pub fn unframe(line: &[u8]) -> Result<&[u8], FormatError> {
    if line.len() < 17 || line[16] != b' ' {
        return Err(FormatError::MalformedLine);
    }
    let stated = std::str::from_utf8(&line[..16])
        .ok()
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .ok_or(FormatError::MalformedChecksum)?;
    let json = &line[17..];
    if fnv64(json) != stated {
        return Err(FormatError::ChecksumMismatch);
    }
    Ok(json)
}

/// A version 1 file's body, validated against its header.
pub fn v1_body(bytes: &[u8]) -> Result<(Header, &[u8]), FormatError> {
    let newline = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(FormatError::NoHeaderLine)?;
    let header: Header = serde_json::from_slice(&bytes[..newline]).map_err(FormatError::Header)?;
    check_header(&header, VERSION_SNAPSHOT)?;
    let body = &bytes[newline + 1..];
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    let (Some(len), Some(sum)) = (header.body_len, header.body_fnv64) else {
        return Err(FormatError::NoBodyLength);
    };
    if body.len() != len {
        return Err(FormatError::Truncated {
            body: body.len(),
            stated: len,
        });
    }
    if fnv64(body) != sum {
        return Err(FormatError::ChecksumMismatch);
    }
    Ok((header, body))
}

pub fn check_header(header: &Header, version: u32) -> Result<(), FormatError> {
    if header.format != FORMAT {
        return Err(FormatError::NotIpq(header.format.clone()));
    }
    if header.version != version {
        return Err(FormatError::Version {
            found: header.version,
        });
    }
    Ok(())
}
