//! Replacing a file so that a crash or a power cut leaves the old one or the whole new one.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `tmp`, fsyncs it, renames it over `path` and fsyncs the directory (a
/// rename is durable only once its directory is). `tmp` must be in `path`'s directory.
pub fn replace(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_parts(path, tmp, &[bytes])
}

/// [`replace`] with the file's bytes in parts, written one after the other (so that a large
/// file need not be copied into one buffer first).
pub fn replace_parts(path: &Path, tmp: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    replace_with(path, tmp, |f| {
        for part in parts {
            f.write_all(part)?;
        }
        Ok(())
    })
}

/// [`replace`] with the file's bytes written by `write` (from another file, say).
pub fn replace_with(
    path: &Path,
    tmp: &Path,
    write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut f = std::fs::File::create(tmp)?;
    write(&mut f)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}
