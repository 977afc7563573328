//! Files written whole or not at all, for every crate that writes one.
//!
//! [`write_atomic`] writes to a new temporary file in the target's directory, flushes and
//! `fsync`s it, and renames it over the target (then `fsync`s the directory, on Unix). A
//! process killed at any point, a full disk or a failed write leaves either the old file,
//! intact, or the new one, complete: never a mix, never a truncated file. A reader that has
//! the old file open or memory-mapped keeps reading the old contents (the rename replaces the
//! name, not the file it had opened). [`same_file`] lets a command refuse to write over its
//! own input.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `path` atomically: `write` fills a buffered temporary file beside it, which is then
/// synced and renamed over `path`. On any error (from `write`, the disk or the rename) the
/// temporary file is removed and `path` is left as it was. A symbolic link at `path` is
/// followed: the file it points to is replaced, the link stays. A file being replaced keeps
/// its permissions.
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    let target = resolve(path)?;
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let (tmp, file) = create_temporary(&dir, &name.to_string_lossy())?;
    let result = (|| {
        if let Ok(meta) = std::fs::metadata(&target) {
            file.set_permissions(meta.permissions())?;
        }
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        // Closed at the end of this block, before the rename.
        {
            let file = w.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &target)?;
        sync_dir(&dir);
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// [`write_atomic`] of a byte slice.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// True when `a` and `b` name the same existing file (through links, relative paths or hard
/// links); false when either does not exist.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(ma), Ok(mb)) => same_identity(&ma, &mb, a, b),
        _ => false,
    }
}

#[cfg(unix)]
fn same_identity(ma: &std::fs::Metadata, mb: &std::fs::Metadata, _: &Path, _: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    ma.dev() == mb.dev() && ma.ino() == mb.ino()
}

#[cfg(not(unix))]
fn same_identity(_: &std::fs::Metadata, _: &std::fs::Metadata, a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The file a write to `path` replaces: `path` itself, or where a symbolic link there points.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => std::fs::canonicalize(path),
        Ok(meta) if meta.is_dir() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is a directory", path.display()),
        )),
        _ => Ok(path.to_path_buf()),
    }
}

/// A new file `.NAME.tmp-PID-N` in `dir`, created exclusively (never an existing file).
fn create_temporary(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Makes a rename in `dir` durable (Unix: `fsync` of the directory; best effort elsewhere).
fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    #[cfg(not(unix))]
    let _ = dir;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hal-durable-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect()
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = scratch("fail");
        let path = dir.join("data.bin");
        write_bytes_atomic(&path, b"old contents").unwrap();
        let err = write_atomic(&path, |w| {
            w.write_all(b"half of the new")?;
            Err(io::Error::other("interrupted"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
        assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
        write_bytes_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(leftovers(&dir).is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn same_file_sees_through_relative_paths() {
        let dir = scratch("same");
        let a = dir.join("a");
        write_bytes_atomic(&a, b"x").unwrap();
        assert!(same_file(&a, &dir.join(".").join("a")));
        assert!(!same_file(&a, &dir.join("b")));
        assert!(
            write_bytes_atomic(&dir, b"x").is_err(),
            "a directory is refused"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(unix)]
    #[test]
    fn a_link_is_followed_and_kept() {
        let dir = scratch("link");
        let real = dir.join("real");
        write_bytes_atomic(&real, b"1").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write_bytes_atomic(&link, b"2").unwrap();
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&real).unwrap(), b"2");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
