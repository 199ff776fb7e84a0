//! What the watcher's trampolines need from the kernel's own BTF (`/sys/kernel/btf/vmlinux`):
//! the offsets of the few fields they read (`struct bpf_map`'s `id` and `writecnt`, `struct
//! file`'s `private_data`), which move between kernel versions and configurations.
//!
//! aya parses BTF for loading programs but does not expose a type's members; this reads just
//! enough of the format (`Documentation/bpf/btf.rst`): the header, then the types one after
//! another, each a 12-byte `struct btf_type` and its kind's trailing data.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// The kernel's BTF, where the running kernel publishes it.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Debug, Error)]
pub enum KernelBtfError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not BTF ({why})", path.display())]
    Malformed { path: PathBuf, why: String },
    #[error("the kernel's BTF has no struct {name}")]
    NoStruct { name: String },
    #[error("the kernel's BTF has no member {member} in struct {name}")]
    NoMember { name: String, member: String },
}

/// The offsets the trampolines read at, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOffsets {
    pub map_id: u32,
    pub map_writecnt: u32,
    pub file_private_data: u32,
}

impl WatchOffsets {
    /// Found in the BTF at `path`.
    pub fn from_file(path: &Path) -> Result<Self, KernelBtfError> {
        let bytes = std::fs::read(path).map_err(|source| KernelBtfError::Read {
            path: path.to_owned(),
            source,
        })?;
        let btf = StructIndex::parse(&bytes).map_err(|why| KernelBtfError::Malformed {
            path: path.to_owned(),
            why,
        })?;
        Ok(Self {
            map_id: btf.member_offset("bpf_map", "id")?,
            map_writecnt: btf.member_offset("bpf_map", "writecnt")?,
            file_private_data: btf.member_offset("file", "private_data")?,
        })
    }
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// The structs of a BTF blob, by name: each one's members, (name, bit offset).
struct StructIndex<'a> {
    strings: &'a [u8],
    structs: Vec<(u32, Vec<(u32, u32)>)>,
}

impl<'a> StructIndex<'a> {
    fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        let u16_at = |at: usize| -> Result<u16, String> {
            bytes
                .get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .ok_or_else(|| format!("truncated at {at}"))
        };
        let u32_at = |at: usize| -> Result<u32, String> {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(|| format!("truncated at {at}"))
        };
        if u16_at(0)? != BTF_MAGIC {
            return Err("bad magic (or not little-endian)".to_owned());
        }
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let strings = bytes
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or("strings beyond the end")?;
        let (mut at, end) = (hdr_len + type_off, hdr_len + type_off + type_len);
        let mut structs = Vec::new();
        while at < end {
            let name = u32_at(at)?;
            let info = u32_at(at + 4)?;
            let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, info & 0xffff, info >> 31 == 1);
            let vlen = vlen as usize;
            at += 12;
            let trailing = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    if kind == KIND_STRUCT {
                        let mut members = Vec::with_capacity(vlen);
                        for m in 0..vlen {
                            let member = at + m * 12;
                            let offset = u32_at(member + 8)?;
                            // With kind_flag, the low 24 bits are the bit offset.
                            let offset = if kind_flag {
                                offset & 0xff_ffff
                            } else {
                                offset
                            };
                            members.push((u32_at(member)?, offset));
                        }
                        structs.push((name, members));
                    }
                    vlen * 12
                }
                KIND_ENUM | KIND_FUNC_PROTO => vlen * 8,
                KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
                2 | 7..=12 | 16 | 18 => 0,
                other => return Err(format!("unknown kind {other} at {at}")),
            };
            at += trailing;
        }
        Ok(Self { strings, structs })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let tail = self.strings.get(offset as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    }

    /// The byte offset of `member` in the struct `name` (the first struct of that name with
    /// members: a declaration has none).
    fn member_offset(&self, name: &str, member: &str) -> Result<u32, KernelBtfError> {
        let (_, members) = self
            .structs
            .iter()
            .find(|(n, members)| self.name(*n) == name.as_bytes() && !members.is_empty())
            .ok_or_else(|| KernelBtfError::NoStruct {
                name: name.to_owned(),
            })?;
        members
            .iter()
            .find(|(n, _)| self.name(*n) == member.as_bytes())
            .map(|(_, bits)| bits / 8)
            .ok_or_else(|| KernelBtfError::NoMember {
                name: name.to_owned(),
                member: member.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's offsets are found and plausible (this host has BTF: the kernel
    /// tier and the privileged tests need it too).
    #[test]
    fn the_running_kernels_offsets_are_found() {
        let offsets = WatchOffsets::from_file(Path::new(VMLINUX_BTF))
            .unwrap_or_else(|e| panic!("{e}: the watcher's trampolines need the kernel's BTF"));
        // `id` follows the ops, inner map meta and security pointers, the type fields and
        // sizes: well inside the struct, and 4-aligned; `writecnt` after it.
        assert!(
            offsets.map_id >= 8 && offsets.map_id.is_multiple_of(4),
            "{offsets:?}"
        );
        assert!(offsets.map_writecnt > offsets.map_id, "{offsets:?}");
        assert!(offsets.map_writecnt.is_multiple_of(8), "{offsets:?}");
        assert!(offsets.file_private_data.is_multiple_of(8), "{offsets:?}");
    }

    #[test]
    fn a_blob_that_is_not_btf_is_refused_by_name() {
        let e = StructIndex::parse(b"\x7fELF....................").err();
        assert_eq!(e.as_deref(), Some("bad magic (or not little-endian)"));
    }
}
