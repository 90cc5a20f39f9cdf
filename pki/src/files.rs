//! Reading and writing the files of the PKI directory: keys private (mode 0600), certificates
//! readable, each written whole through a temporary file and a rename.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::PkiError;

pub(crate) const KEY_MODE: u32 = 0o600;
pub(crate) const CERT_MODE: u32 = 0o644;

pub(crate) fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, PkiError> {
    fs::read(path).map_err(|source| PkiError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Writes a private file (mode 0600) through a temporary file and a rename, so that a crash
/// never leaves half a key.
pub fn write_private(path: &Path, contents: &[u8], what: &'static str) -> Result<(), PkiError> {
    write_file(path, contents, KEY_MODE, what)
}

/// Writes `contents` to `path` with `mode` through a temporary file and a rename, so readers see
/// either the old file or the whole new one, never a torn key.
pub(crate) fn write_file(
    path: &Path,
    contents: &[u8],
    mode: u32,
    what: &'static str,
) -> Result<(), PkiError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PkiError::Write { what, path, source }
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);

    // A leftover from a crash may have other permissions; start from a fresh file.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(write_err(&tmp)(err)),
    }
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(write_err(&tmp))?;
    file.write_all(contents).map_err(write_err(&tmp))?;
    file.sync_all().map_err(write_err(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(write_err(path))?;

    // Make the rename itself durable.
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(write_err(dir))?;
    }
    Ok(())
}
