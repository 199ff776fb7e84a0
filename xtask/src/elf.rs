//! The few bytes of an ELF header the cross build checks: which machine an executable is for.
//! (`file` says the same; reading the header needs no tool the machine may lack.)

use std::fs::File;
use std::io::Read as _;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// `e_machine` of x86-64.
pub const EM_X86_64: u16 = 62;
/// `e_machine` of AArch64 (arm64).
pub const EM_AARCH64: u16 = 183;

/// The `e_machine` of the 64-bit little-endian ELF file at `path`; an error naming the file
/// when it is not one.
pub fn machine(path: &Path) -> Result<u16> {
    let mut header = [0u8; 20];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .with_context(|| format!("cannot read the ELF header of {}", path.display()))?;
    machine_of(&header).with_context(|| format!("{}", path.display()))
}

/// `e_machine` from the first 20 bytes of an ELF file.
fn machine_of(header: &[u8; 20]) -> Result<u16> {
    if header[..4] != *b"\x7fELF" {
        bail!("not an ELF file");
    }
    // EI_CLASS 2: 64-bit; EI_DATA 1: little-endian (both arm64 and x86-64 Linux are).
    if header[4] != 2 || header[5] != 1 {
        bail!(
            "not a 64-bit little-endian ELF file (class {}, data {})",
            header[4],
            header[5]
        );
    }
    Ok(u16::from_le_bytes([header[18], header[19]]))
}

/// A name for an `e_machine`, for messages.
pub fn machine_name(machine: u16) -> String {
    match machine {
        EM_X86_64 => "x86-64".to_owned(),
        EM_AARCH64 => "aarch64".to_owned(),
        247 => "bpf".to_owned(),
        other => format!("machine {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_machine_of_the_running_executable() {
        let exe = std::env::current_exe().unwrap();
        let expected = if cfg!(target_arch = "x86_64") {
            EM_X86_64
        } else if cfg!(target_arch = "aarch64") {
            EM_AARCH64
        } else {
            panic!("add this architecture's e_machine to the test");
        };
        assert_eq!(machine(&exe).unwrap(), expected);
    }

    #[test]
    fn reads_an_aarch64_header_and_refuses_what_is_not_elf64_le() {
        let mut header = [0u8; 20];
        header[..6].copy_from_slice(b"\x7fELF\x02\x01");
        header[18..20].copy_from_slice(&EM_AARCH64.to_le_bytes());
        assert_eq!(machine_of(&header).unwrap(), EM_AARCH64);

        let mut elf32 = header;
        elf32[4] = 1;
        let err = machine_of(&elf32).unwrap_err().to_string();
        assert!(err.contains("64-bit little-endian"), "{err}");

        let script = *b"#!/bin/sh\necho hi\n\0\0";
        let err = machine_of(&script).unwrap_err().to_string();
        assert!(err.contains("not an ELF file"), "{err}");
    }
}
