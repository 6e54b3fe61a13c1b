//! Reading files named by untrusted input (command-line paths, a graph's weights file,
//! the server's own workspace files): regular files only — never a device, FIFO, socket
//! or folder — and at most a given size, checked on the opened file before anything is
//! read or allocated.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

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

/// Reads a regular UTF-8 text file of at most `limit` bytes.
pub fn read_text_bounded(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
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
        std::fs::write(&small, [0xff, 0xfe]).unwrap();
        let e = read_text_bounded(&small, 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
