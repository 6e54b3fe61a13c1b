//! Reading files named by untrusted input (command-line paths, a graph's weights file,
//! the server's own workspace files): regular files only — never a device, FIFO, socket
//! or folder — and at most a given size, checked on the opened file before anything is
//! read or allocated. Writing files durably (temp file, fsync, rename, fsync of the
//! folder), so a crash leaves the old bytes or the new.

use anyhow::{Context, Result};
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Refuses what is not a regular file, or a file over `limit` bytes.
fn check(meta: &Metadata, limit: u64) -> io::Result<()> {
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a device, FIFO, socket or folder)",
        ));
    }
    if meta.len() > limit {
        return Err(too_large(meta.len(), limit));
    }
    Ok(())
}

fn too_large(len: u64, limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!("{len} bytes, over the limit of {limit} bytes"),
    )
}

/// Opens a file for reading without waiting (a FIFO swapped in after the check would
/// otherwise block the open until a writer appears).
fn open(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// Reads a regular file of at most `limit` bytes. The kind and size are checked before
/// opening, again on the opened file, and the read stops one byte past the limit, so a
/// file that grows while it is read is refused too.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    check(&std::fs::metadata(path)?, limit)?;
    let file = open(path)?;
    let meta = file.metadata()?;
    check(&meta, limit)?;
    // The size is at most `limit`, which the caller chose to allow.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > limit {
        return Err(too_large(read, limit));
    }
    Ok(bytes)
}

/// Reads `length` bytes from `offset` of a regular file (an ONNX model's external data):
/// the kind is checked before opening and again on the opened file, the range against
/// its size before anything is allocated, and a file that ends early is an error.
pub fn read_range(path: &Path, offset: u64, length: u64) -> io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    check(&std::fs::metadata(path)?, u64::MAX)?;
    let mut file = open(path)?;
    let size = file.metadata()?;
    check(&size, u64::MAX)?;
    let size = size.len();
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("it has {size} bytes; {length} are asked for from byte {offset}"),
        ));
    }
    let length = usize::try_from(length)
        .map_err(|_| io::Error::new(io::ErrorKind::FileTooLarge, "too large for this machine"))?;
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = vec![0; length];
    file.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// Reads a regular UTF-8 text file of at most `limit` bytes.
pub fn read_text_bounded(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Writes `bytes` as `dir/name` durably: a temp file no other writer shares (created
/// exclusively, named by process and a counter), fsync, rename over the old file, fsync
/// of the folder. Concurrent writers of one name each rename a whole file; the last wins.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    refuse_non_regular(&dir.join(name))?;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    let renamed = written.and_then(|()| std::fs::rename(&tmp, dir.join(name)));
    if let Err(e) = renamed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", dir.join(name).display()));
    }
    sync_dir(dir)
}

/// Refuses to write over what is not a regular file: an output replaces a file, never a
/// device (`/dev/null`), FIFO, socket or folder that happens to have its name. A path
/// that does not exist yet (or a dangling link) is fine.
pub fn refuse_non_regular(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if !meta.is_file() => anyhow::bail!(
            "will not write {}: it exists and is not a regular file (a device, FIFO, socket or folder)",
            path.display()
        ),
        _ => Ok(()),
    }
}

/// [`write_durably`] for a path: its folder (the current one when it has none) and name.
pub fn write_path_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} names no file", path.display()))?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    write_durably(dir, name, bytes)
}

/// Makes a folder's entries (a rename, a removal) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot sync {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_folders_and_large_files_are_refused_before_reading() {
        let dir = std::env::temp_dir().join(format!("sluice-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let small = dir.join("small");
        std::fs::write(&small, b"abc").unwrap();
        assert_eq!(read_bounded(&small, 3).unwrap(), b"abc");
        let e = read_bounded(&small, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        let e = read_bounded(&dir, 1 << 20).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        #[cfg(unix)]
        for device in ["/dev/zero", "/dev/null"] {
            let e = read_bounded(Path::new(device), 1 << 20).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{device}");
        }
        #[cfg(unix)]
        {
            let fifo = dir.join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = read_bounded(&fifo, 1 << 20).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        assert_eq!(read_range(&small, 1, 2).unwrap(), b"bc");
        let e = read_range(&small, 2, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(read_range(&small, u64::MAX, 2).is_err());
        let e = read_range(&dir, 0, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        #[cfg(unix)]
        {
            let e = read_range(&dir.join("fifo"), 0, 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            let e = read_range(Path::new("/dev/zero"), 0, 1).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        }
        std::fs::write(&small, [0xff, 0xfe]).unwrap();
        let e = read_text_bounded(&small, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
