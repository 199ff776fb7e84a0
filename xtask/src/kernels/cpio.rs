//! A writer of the "newc" cpio format the kernel unpacks as its initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst): directories, files and
//! character devices, all owned by root, written straight from their source files with no staging
//! copy and no external tool.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

pub struct Writer {
    out: BufWriter<File>,
    written: u64,
    next_ino: u32,
    /// The device number of the entry being written (character devices only).
    rdev: (u32, u32),
}

impl Writer {
    pub fn create(path: &Path) -> Result<Writer> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Writer {
            out: BufWriter::new(file),
            written: 0,
            next_ino: 1,
            rdev: (0, 0),
        })
    }

    pub fn dir(&mut self, name: &str) -> Result<()> {
        self.entry(name, S_IFDIR | 0o755, 2, &[])
    }

    /// A character device node: the kernel opens `/dev/console` for `/init` before anything
    /// could mount devtmpfs.
    pub fn char_device(&mut self, name: &str, major: u32, minor: u32) -> Result<()> {
        self.rdev = (major, minor);
        let written = self.entry(name, S_IFCHR | 0o600, 1, &[]);
        self.rdev = (0, 0);
        written
    }

    /// A regular file with `data`; `mode` is the permission bits.
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.entry(name, S_IFREG | mode, 1, data)
    }

    /// A regular file with the contents of `source` on the host.
    pub fn copy(&mut self, name: &str, mode: u32, source: &Path) -> Result<()> {
        let data =
            std::fs::read(source).with_context(|| format!("cannot read {}", source.display()))?;
        self.file(name, mode, &data)
    }

    /// Writes the trailer and flushes; returns the archive's size.
    pub fn finish(mut self) -> Result<u64> {
        self.entry("TRAILER!!!", 0, 1, &[])?;
        self.out.flush().context("writing the initramfs")?;
        Ok(self.written)
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, data: &[u8]) -> Result<()> {
        let name = name.trim_start_matches('/');
        let ino = self.next_ino;
        self.next_ino += 1;
        let fields = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime: fixed, so the same inputs make the same archive
            u32::try_from(data.len()).context("a file of the initramfs is over 4 GiB")?,
            0, // dev major
            0, // dev minor
            self.rdev.0,
            self.rdev.1,
            u32::try_from(name.len() + 1).context("name too long")?,
            0, // check
        ];
        let mut header = String::from("070701");
        for field in fields {
            header.push_str(&format!("{field:08x}"));
        }
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad().context("writing the initramfs")
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Pads to a multiple of 4 bytes, as newc requires after the name and after the data.
    fn pad(&mut self) -> io::Result<()> {
        let rem = (self.written % 4) as usize;
        if rem != 0 {
            self.put(&[0; 4][..4 - rem])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_newc_and_aligned() {
        let dir = std::env::temp_dir().join(format!("xtask-cpio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.cpio");
        let mut w = Writer::create(&path).unwrap();
        w.dir("/bin").unwrap();
        w.file("/bin/x", 0o755, b"hello").unwrap();
        w.char_device("/console", 5, 1).unwrap();
        let size = w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(bytes.len() as u64, size);
        assert_eq!(size % 4, 0);
        assert!(bytes.starts_with(b"070701"));
        // The file's header: mode 0100755, size 5, name "bin/x" (6 bytes with its NUL).
        // The first entry is a 110-byte header and "bin\0", padded to 116 bytes.
        let second = 116;
        assert_eq!(&bytes[second..second + 6], b"070701");
        let field = |i: usize| &bytes[second + 6 + 8 * i..second + 14 + 8 * i];
        assert_eq!(field(1), b"000081ed");
        assert_eq!(field(6), b"00000005");
        assert_eq!(field(11), b"00000006");
        let tail = String::from_utf8_lossy(&bytes);
        assert!(tail.contains("TRAILER!!!"));
    }
}
