//! What the watcher's trampolines need from the kernel's own BTF (`/sys/kernel/btf/vmlinux`):
//! the offsets of the few fields they read (`struct bpf_map`'s `id` and `writecnt`, `struct
//! file`'s `private_data`), which move between kernel versions and configurations, and the
//! context slot of the one argument whose place changed (`bpf_map_update_value`'s key: older
//! kernels pass `struct fd` by value before it).
//!
//! aya parses BTF for loading programs but does not expose a type's members; this reads just
//! enough of the format (`Documentation/bpf/btf.rst`): the header, then the types one after
//! another, each a 12-byte `struct btf_type` and its kind's trailing data.

use std::path::{Path, PathBuf};

use ipq_common::watch::{UpdateHook, UPDATE_KEY_SLOTS};
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
    #[error("the kernel's BTF does not give {function}'s parameter {param}: {why}")]
    NoParam {
        function: String,
        param: String,
        why: String,
    },
    #[error(
        "{function}'s parameter {param} is in slot {slot} of the trampoline's context; the \
         watcher reads it in slot {expected}"
    )]
    UnexpectedSlot {
        function: &'static str,
        param: &'static str,
        slot: u32,
        expected: String,
    },
}

/// The offsets the trampolines read at, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOffsets {
    pub map_id: u32,
    pub map_writecnt: u32,
    pub file_private_data: u32,
    /// Where map updates are seen.
    pub update_hook: UpdateHook,
    /// The context slot of `bpf_map_update_value`'s `key`
    /// ([`ipq_common::watch::GLOBAL_UPDATE_KEY_SLOT`]; 2, unused, with the map types' hooks).
    pub update_key_slot: u32,
}

impl WatchOffsets {
    /// Found in the BTF at `path`.
    pub fn from_file(path: &Path) -> Result<Self, KernelBtfError> {
        let bytes = std::fs::read(path).map_err(|source| KernelBtfError::Read {
            path: path.to_owned(),
            source,
        })?;
        let btf = TypeTable::parse(&bytes).map_err(|why| KernelBtfError::Malformed {
            path: path.to_owned(),
            why,
        })?;
        Self::from_table(&btf)
    }

    fn from_table(btf: &TypeTable<'_>) -> Result<Self, KernelBtfError> {
        let (update_hook, update_key_slot) = update_hook(btf)?;
        Ok(Self {
            map_id: btf.member_offset("bpf_map", "id")?,
            map_writecnt: btf.member_offset("bpf_map", "writecnt")?,
            file_private_data: btf.member_offset("file", "private_data")?,
            update_hook,
            update_key_slot,
        })
    }
}

/// Where the trampolines see map updates on this kernel, and the key's slot there: bpf()'s own
/// path where the BTF gives `bpf_map_update_value`, else the map types' update functions.
fn update_hook(btf: &TypeTable<'_>) -> Result<(UpdateHook, u32), KernelBtfError> {
    const UPDATE: &str = "bpf_map_update_value";
    const KEY: &str = "key";
    let expect = |function: &'static str, slot: u32, slots: &[u32]| {
        if slots.contains(&slot) {
            Ok(slot)
        } else {
            Err(KernelBtfError::UnexpectedSlot {
                function,
                param: KEY,
                slot,
                expected: format!("{slots:?}"),
            })
        }
    };
    if let Some(slot) = btf.param_slot(UPDATE, KEY)? {
        return Ok((
            UpdateHook::SyscallPath,
            expect(UPDATE, slot, &UPDATE_KEY_SLOTS)?,
        ));
    }
    for function in ["htab_map_update_elem", "array_map_update_elem"] {
        let slot = btf
            .param_slot(function, KEY)?
            .ok_or_else(|| KernelBtfError::NoParam {
                function: function.to_owned(),
                param: KEY.to_owned(),
                why: format!("no such function (nor {UPDATE})"),
            })?;
        // The map, then the key: what the programs on these read.
        expect(function, slot, &[1])?;
    }
    Ok((UpdateHook::MapOps, UPDATE_KEY_SLOTS[0]))
}

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One type of the blob: what the lookups here need of it.
struct Type {
    kind: u32,
    name: u32,
    /// The size in bytes (INT, STRUCT, UNION, ENUM, ENUM64, FLOAT) or the type referred to
    /// (PTR, TYPEDEF, qualifiers, FUNC, FUNC_PROTO's return).
    size_or_type: u32,
    /// A struct's members (name, bit offset) or a function prototype's parameters (name,
    /// type id); empty otherwise.
    entries: Vec<(u32, u32)>,
}

/// The types of a BTF blob, by id (id 0 is `void`, the first type is id 1).
struct TypeTable<'a> {
    strings: &'a [u8],
    types: Vec<Type>,
}

impl<'a> TypeTable<'a> {
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
        let mut types = Vec::new();
        while at < end {
            let name = u32_at(at)?;
            let info = u32_at(at + 4)?;
            let size_or_type = u32_at(at + 8)?;
            let (kind, vlen, kind_flag) = ((info >> 24) & 0x1f, info & 0xffff, info >> 31 == 1);
            let vlen = vlen as usize;
            at += 12;
            let mut entries = Vec::new();
            let trailing = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    if kind == KIND_STRUCT {
                        entries.reserve(vlen);
                        for m in 0..vlen {
                            let member = at + m * 12;
                            let offset = u32_at(member + 8)?;
                            // With kind_flag, the low 24 bits are the bit offset.
                            let offset = if kind_flag {
                                offset & 0xff_ffff
                            } else {
                                offset
                            };
                            entries.push((u32_at(member)?, offset));
                        }
                    }
                    vlen * 12
                }
                KIND_FUNC_PROTO => {
                    entries.reserve(vlen);
                    for p in 0..vlen {
                        let param = at + p * 8;
                        entries.push((u32_at(param)?, u32_at(param + 4)?));
                    }
                    vlen * 8
                }
                KIND_ENUM => vlen * 8,
                KIND_DATASEC | KIND_ENUM64 => vlen * 12,
                KIND_PTR | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                other => return Err(format!("unknown kind {other} at {at}")),
            };
            at += trailing;
            types.push(Type {
                kind,
                name,
                size_or_type,
                entries,
            });
        }
        Ok(Self { strings, types })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let tail = self.strings.get(offset as usize..).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    /// The byte offset of `member` in the struct `name` (the first struct of that name with
    /// members: a declaration has none).
    fn member_offset(&self, name: &str, member: &str) -> Result<u32, KernelBtfError> {
        let ty = self
            .types
            .iter()
            .find(|t| {
                t.kind == KIND_STRUCT
                    && !t.entries.is_empty()
                    && self.name(t.name) == name.as_bytes()
            })
            .ok_or_else(|| KernelBtfError::NoStruct {
                name: name.to_owned(),
            })?;
        ty.entries
            .iter()
            .find(|(n, _)| self.name(*n) == member.as_bytes())
            .map(|(_, bits)| bits / 8)
            .ok_or_else(|| KernelBtfError::NoMember {
                name: name.to_owned(),
                member: member.to_owned(),
            })
    }

    /// The size in bytes of type `id`, through typedefs and qualifiers.
    fn size_of(&self, mut id: u32) -> Option<u32> {
        // A chain of typedefs and qualifiers is short; the bound stops a malformed loop.
        for _ in 0..32 {
            let ty = self.get(id)?;
            match ty.kind {
                KIND_PTR => return Some(8),
                KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT => {
                    return Some(ty.size_or_type)
                }
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = ty.size_or_type
                }
                _ => return None,
            }
        }
        None
    }

    /// The slot of a trampoline's context (a u64 each) that holds parameter `param` of the
    /// kernel function `function`: a parameter passed by value takes as many slots as its
    /// size in u64s (a struct of 16 bytes, two), as the trampolines lay them out.
    /// `None` where the BTF has no such function (inlined into its callers, or not built).
    fn param_slot(&self, function: &str, param: &str) -> Result<Option<u32>, KernelBtfError> {
        let no_param = |why: String| KernelBtfError::NoParam {
            function: function.to_owned(),
            param: param.to_owned(),
            why,
        };
        let Some(func) = self
            .types
            .iter()
            .find(|t| t.kind == KIND_FUNC && self.name(t.name) == function.as_bytes())
        else {
            return Ok(None);
        };
        let proto = self
            .get(func.size_or_type)
            .filter(|t| t.kind == KIND_FUNC_PROTO)
            .ok_or_else(|| no_param("its type is not a prototype".to_owned()))?;
        let mut slot = 0;
        for (name, ty) in &proto.entries {
            if self.name(*name) == param.as_bytes() {
                return Ok(Some(slot));
            }
            let size = self.size_of(*ty).ok_or_else(|| {
                no_param(format!(
                    "the size of parameter {} is unknown",
                    String::from_utf8_lossy(self.name(*name))
                ))
            })?;
            slot += size.div_ceil(8);
        }
        Err(no_param("no parameter of that name".to_owned()))
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
        // This kernel's second parameter is `struct file *map_file`: one slot.
        assert_eq!(offsets.update_key_slot, 2, "{offsets:?}");
    }

    /// Parameter types of the blobs below: 1 u64, 2 void *, 4 struct fd (through a typedef).
    const U64: u32 = 1;
    const PTR: u32 = 2;
    const FD: u32 = 4;

    /// A BTF blob with the basic types and one function per `functions` entry (its name and
    /// its parameters' names and types).
    fn btf_of(functions: &[(&str, &[(&str, u32)])]) -> Vec<u8> {
        let mut strings = vec![0u8];
        let mut name = |n: &str| -> u32 {
            let at = strings.len() as u32;
            strings.extend_from_slice(n.as_bytes());
            strings.push(0);
            at
        };
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, size_or_type: u32, trailing: &[u32]| {
            types.extend_from_slice(&name.to_le_bytes());
            types.extend_from_slice(&((kind << 24) | vlen).to_le_bytes());
            types.extend_from_slice(&size_or_type.to_le_bytes());
            for word in trailing {
                types.extend_from_slice(&word.to_le_bytes());
            }
        };
        // 1: u64; 2: void *; 3: struct fd { void *file; u64 flags; }; 4: a typedef of it
        // (the kernel's types are often reached through one).
        ty(name("u64"), KIND_INT, 0, 8, &[64]);
        ty(0, KIND_PTR, 0, 0, &[]);
        let (file, flags) = (name("file"), name("flags"));
        ty(
            name("fd"),
            KIND_STRUCT,
            2,
            16,
            &[file, PTR, 0, flags, U64, 64],
        );
        ty(name("fd_t"), KIND_TYPEDEF, 0, 3, &[]);
        let mut next_id = 5;
        for (function, params) in functions {
            let words: Vec<u32> = params.iter().flat_map(|(n, t)| [name(n), *t]).collect();
            ty(0, KIND_FUNC_PROTO, params.len() as u32, U64, &words);
            ty(name(function), KIND_FUNC, 0, next_id, &[]);
            next_id += 2;
        }
        let mut blob = Vec::new();
        blob.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        blob.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        blob
    }

    /// `bpf_map_update_value`'s prototype with `struct fd` by value as its second parameter
    /// (older kernels) or a pointer (recent ones).
    fn update_value_btf(second_by_value: bool) -> Vec<u8> {
        let second = if second_by_value { FD } else { PTR };
        btf_of(&[(
            "bpf_map_update_value",
            &[
                ("map", PTR),
                ("f", second),
                ("key", PTR),
                ("value", PTR),
                ("flags", U64),
            ],
        )])
    }

    const MAP_OP: &[(&str, u32)] = &[("map", PTR), ("key", PTR), ("value", PTR), ("flags", U64)];

    #[test]
    fn without_bpf_map_update_value_the_map_types_update_functions_are_hooked() {
        let blob = btf_of(&[
            ("htab_map_update_elem", MAP_OP),
            ("array_map_update_elem", MAP_OP),
        ]);
        let btf = TypeTable::parse(&blob).unwrap();
        assert_eq!(update_hook(&btf).unwrap(), (UpdateHook::MapOps, 2));
        // One of them missing: refused, naming it.
        let blob = btf_of(&[("htab_map_update_elem", MAP_OP)]);
        let btf = TypeTable::parse(&blob).unwrap();
        assert_eq!(
            update_hook(&btf).unwrap_err().to_string(),
            "the kernel's BTF does not give array_map_update_elem's parameter key: no such \
             function (nor bpf_map_update_value)"
        );
        // A key where the programs do not read it: refused, naming the slot.
        let moved: &[(&str, u32)] = &[("map", PTR), ("f", FD), ("key", PTR)];
        let blob = btf_of(&[
            ("htab_map_update_elem", moved),
            ("array_map_update_elem", MAP_OP),
        ]);
        let btf = TypeTable::parse(&blob).unwrap();
        assert_eq!(
            update_hook(&btf).unwrap_err().to_string(),
            "htab_map_update_elem's parameter key is in slot 3 of the trampoline's context; the \
             watcher reads it in slot [1]"
        );
    }

    #[test]
    fn a_struct_passed_by_value_moves_the_key_one_slot_on() {
        let by_value = update_value_btf(true);
        let btf = TypeTable::parse(&by_value).unwrap();
        assert_eq!(
            btf.param_slot("bpf_map_update_value", "key").unwrap(),
            Some(3)
        );
        assert_eq!(
            btf.param_slot("bpf_map_update_value", "flags").unwrap(),
            Some(5)
        );
        let by_pointer = update_value_btf(false);
        let btf = TypeTable::parse(&by_pointer).unwrap();
        assert_eq!(
            btf.param_slot("bpf_map_update_value", "key").unwrap(),
            Some(2)
        );
        assert_eq!(update_hook(&btf).unwrap(), (UpdateHook::SyscallPath, 2));
    }

    #[test]
    fn a_parameter_the_btf_does_not_give_is_refused_by_name() {
        let blob = update_value_btf(true);
        let btf = TypeTable::parse(&blob).unwrap();
        let e = btf.param_slot("bpf_map_update_value", "attr").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the kernel's BTF does not give bpf_map_update_value's parameter attr: no parameter \
             of that name"
        );
        // A function the BTF does not give: none (the caller decides what that means).
        assert_eq!(btf.param_slot("map_update_elem", "key").unwrap(), None);
        // The rest of what the trampolines need is not in this blob: refused by name too.
        let e = WatchOffsets::from_table(&btf).unwrap_err();
        assert_eq!(e.to_string(), "the kernel's BTF has no struct bpf_map");
    }

    #[test]
    fn a_blob_that_is_not_btf_is_refused_by_name() {
        let e = TypeTable::parse(b"\x7fELF....................").err();
        assert_eq!(e.as_deref(), Some("bad magic (or not little-endian)"));
    }
}
