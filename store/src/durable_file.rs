//! Replacing a file so that a crash or a power cut leaves the old one or the whole new one.

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `tmp`, fsyncs it, renames it over `path` and fsyncs the directory (a
/// rename is durable only once its directory is). `tmp` must be in `path`'s directory.
pub fn replace(path: &Path, tmp: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}
