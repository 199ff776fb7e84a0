//! Replaying a journal file: the current line log, or the earlier full-snapshot format.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{self, BufRead as _, BufReader, Read as _, Seek as _, SeekFrom},
};

use serde::Deserialize;

use super::{
    boot_id,
    format::{self, check_header, unframe, Header, Line, VERSION, VERSION_SNAPSHOT},
    Entry, Loaded,
};

/// The end of a file cut short by a crash: a write that was never acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// Where the valid part ends (the file is truncated there).
    pub at: u64,
    /// How many bytes were dropped.
    pub dropped: u64,
}

pub enum ReadError {
    Io(io::Error),
    Corrupt(String),
    /// An ipq journal of this newer format version: not this agent's to read or to judge.
    Newer(u32),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

pub struct Read<E> {
    pub loaded: Loaded<E>,
    /// Bytes up to the end of the last valid line.
    pub valid_len: u64,
    /// Bytes of the header and base lines.
    pub base_len: u64,
}

/// The earlier format's body (a registry snapshot; other fields are ignored).
#[derive(Deserialize)]
#[serde(bound(deserialize = "E: serde::de::DeserializeOwned"))]
struct SnapshotV1<E> {
    version: u32,
    records: Vec<E>,
}

pub fn read<E: Entry>(file: &mut File) -> Result<Read<E>, ReadError> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let buffered = reader.fill_buf()?;
    let first_line = buffered.split(|&b| b == b'\n').next().unwrap_or_default();
    if let Some(version) = format::newer_version(first_line) {
        return Err(ReadError::Newer(version));
    }
    match buffered.first().copied() {
        None => Err(ReadError::Corrupt("empty file".into())),
        Some(b'{') => read_v1(reader),
        Some(_) => read_v2(reader),
    }
}

fn read_v1<E: Entry>(mut reader: BufReader<&mut File>) -> Result<Read<E>, ReadError> {
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes)?;
    let (header, body) = format::v1_body(&bytes).map_err(|e| ReadError::Corrupt(e.to_string()))?;
    let body: SnapshotV1<E> =
        serde_json::from_slice(body).map_err(|e| ReadError::Corrupt(format!("body: {e}")))?;
    if body.version != 1 {
        return Err(ReadError::Corrupt(format!(
            "snapshot version {} is not the version 1 this agent reads",
            body.version
        )));
    }
    Ok(Read {
        loaded: Loaded {
            records: body.records,
            same_boot: same_boot(&header),
            written_mono_ns: header.written_mono_ns,
            written_unix_ms: header.written_unix_ms,
            version: VERSION_SNAPSHOT,
            torn_tail: None,
        },
        valid_len: bytes.len() as u64,
        base_len: bytes.len() as u64,
    })
}

fn same_boot(header: &Header) -> bool {
    header.boot_id.is_some() && header.boot_id == boot_id()
}

fn read_v2<E: Entry>(mut reader: BufReader<&mut File>) -> Result<Read<E>, ReadError> {
    let corrupt = |at: u64, what: String| ReadError::Corrupt(format!("line at byte {at}: {what}"));
    let mut buf = Vec::new();
    reader.read_until(b'\n', &mut buf)?;
    let header: Header = match buf.strip_suffix(b"\n").map(unframe) {
        Some(Ok(json)) => {
            serde_json::from_slice(json).map_err(|e| ReadError::Corrupt(format!("header: {e}")))?
        }
        Some(Err(reason)) => return Err(ReadError::Corrupt(format!("header: {reason}"))),
        None => return Err(ReadError::Corrupt("header: incomplete".into())),
    };
    check_header(&header, VERSION).map_err(|e| ReadError::Corrupt(e.to_string()))?;
    let mut offset = buf.len() as u64;
    let mut base_len = offset;
    let mut in_base = true;
    let (mut mono, mut unix) = (header.written_mono_ns, header.written_unix_ms);
    let mut records: BTreeMap<E::Key, E> = BTreeMap::new();
    let mut torn_tail = None;
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)? as u64;
        if n == 0 {
            break;
        }
        let Some(line) = buf.strip_suffix(b"\n") else {
            // No newline up to the end of the file: the last write was cut short (by a crash,
            // or zero-filled by a power loss). It was never acknowledged; drop it.
            torn_tail = Some(TornTail {
                at: offset,
                dropped: n,
            });
            break;
        };
        // A whole line that does not check out is damage, not a torn write.
        let json = unframe(line).map_err(|reason| corrupt(offset, reason.to_string()))?;
        let line: Line<E, E::Key> =
            serde_json::from_slice(json).map_err(|e| corrupt(offset, e.to_string()))?;
        if let (Some(m), Some(u)) = (line.m, line.u) {
            (mono, unix) = (m, u);
            in_base = false;
        }
        for record in line.put {
            records.insert(record.key(), record);
        }
        for key in line.del {
            records.remove(&key);
        }
        offset += n;
        if in_base {
            base_len = offset;
        }
    }
    Ok(Read {
        loaded: Loaded {
            records: records.into_values().collect(),
            same_boot: same_boot(&header),
            written_mono_ns: mono,
            written_unix_ms: unix,
            version: VERSION,
            torn_tail,
        },
        valid_len: offset,
        base_len,
    })
}
