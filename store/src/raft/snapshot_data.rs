//! A Raft snapshot's data as openraft moves it: a file, never the whole dump in memory.
//!
//! Sent, [`SnapshotData`] is the data part of the member's snapshot file, which starts after the
//! file's header (the metadata and the data's length), so offsets are shifted by the header's
//! size; a snapshot stream (`snapshot_stream`) reads it through. Received, it is a file of its
//! own in the data dir (`receiving_path`): a snapshot stream writes the snapshot file's head and
//! then the data into it, and the install moves it into place; data received without that head
//! (openraft's own storage tests write at offsets, seek and write) is copied instead.

use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

/// A snapshot's data: a file from `base` to its end.
pub struct SnapshotData {
    file: tokio::fs::File,
    /// Where the data starts in the file.
    base: u64,
    path: PathBuf,
}

impl SnapshotData {
    /// The data of a file whose data starts at `base` and runs to its end.
    pub(super) fn open(path: &Path, base: u64) -> io::Result<Self> {
        let mut file = std::fs::File::open(path)?;
        // A read before any seek reads the data, not the header.
        std::io::Seek::seek(&mut file, SeekFrom::Start(base))?;
        Ok(SnapshotData {
            file: tokio::fs::File::from_std(file),
            base,
            path: path.to_path_buf(),
        })
    }

    /// An empty file at `path` (emptied if it exists), to receive data into.
    pub(super) fn create(path: &Path) -> io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Ok(SnapshotData {
            file: tokio::fs::File::from_std(file),
            base: 0,
            path: path.to_path_buf(),
        })
    }

    /// The file the data is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the data starts in its file.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Writes `head` before the data of a file just created to receive into: the data then
    /// starts after it.
    pub async fn write_head(&mut self, head: &[u8]) -> io::Result<()> {
        use tokio::io::{AsyncSeekExt, AsyncWriteExt};
        if self.base != 0 || self.file.seek(SeekFrom::End(0)).await? != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a head goes only into an empty snapshot file",
            ));
        }
        self.file.write_all(head).await?;
        self.base = head.len() as u64;
        Ok(())
    }

    /// The file, positioned at the start of the data, once pending writes are done.
    pub(super) async fn into_std(self) -> io::Result<std::fs::File> {
        let mut file = self.file;
        tokio::io::AsyncWriteExt::flush(&mut file).await?;
        let mut file = file.into_std().await;
        std::io::Seek::seek(&mut file, SeekFrom::Start(self.base))?;
        Ok(file)
    }
}

/// What the names of the files a follower receives snapshots into start with.
const RECEIVING: &str = "snapshot.receiving";

/// The file a follower receives its `n`th snapshot since start into, in the data dir: one per
/// snapshot, so that a stream the leader gave up and its next one never share a file.
pub(super) fn receiving_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{RECEIVING}.{n}"))
}

/// Whether `path` is a file that snapshots are received into in `dir`.
pub(super) fn is_received(dir: &Path, path: &Path) -> bool {
    path.parent() == Some(dir)
        && path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(RECEIVING))
}

/// Removes the files snapshots were being received into when the member stopped.
pub(super) fn remove_received(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(RECEIVING) {
            remove_if_present(&entry.path())?;
        }
    }
    Ok(())
}

/// Removes the file at `path`; one that is already gone is no error.
pub(super) fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().file).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        let this = self.get_mut();
        let position = match position {
            SeekFrom::Start(n) => SeekFrom::Start(this.base.checked_add(n).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "seek beyond a snapshot's end")
            })?),
            // Backwards from here could land in the header.
            SeekFrom::Current(n) if n < 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a snapshot's data seeks backwards only from its start or end",
                ))
            }
            // The data runs to the file's end.
            other => other,
        };
        Pin::new(&mut this.file).start_seek(position)
    }

    fn poll_complete(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let this = self.get_mut();
        // Before the first seek tokio's file reports position 0, wherever the file stands: it
        // reads as the data's start.
        Pin::new(&mut this.file)
            .poll_complete(cx)
            .map_ok(|at| at.saturating_sub(this.base))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    #[tokio::test]
    async fn data_after_a_header_reads_and_seeks_from_its_own_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"HEADERdata-of-ten").unwrap();
        let mut data = SnapshotData::open(&path, 6).unwrap();
        let mut four = [0u8; 4];
        data.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"data", "unseeked, it reads the data");
        // openraft's sender: the size from the end, then chunks from offsets.
        assert_eq!(data.seek(SeekFrom::End(0)).await.unwrap(), 11);
        assert_eq!(data.seek(SeekFrom::Start(5)).await.unwrap(), 5);
        let mut rest = String::new();
        data.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "of-ten");
        data.seek(SeekFrom::Start(0)).await.unwrap();
        data.read_exact(&mut four).await.unwrap();
        assert_eq!(&four, b"data");
        let err = data.seek(SeekFrom::Current(-1)).await.unwrap_err();
        assert!(err.to_string().contains("backwards"), "{err}");
        assert_eq!(data.seek(SeekFrom::End(-3)).await.unwrap(), 8);
        let mut file = data.into_std().await.unwrap();
        let mut all = String::new();
        std::io::Read::read_to_string(&mut file, &mut all).unwrap();
        assert_eq!(all, "data-of-ten");
    }

    #[tokio::test]
    async fn chunks_received_at_their_offsets_make_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = receiving_path(dir.path(), 0);
        std::fs::write(&path, b"an older, longer receipt").unwrap();
        let mut data = SnapshotData::create(&path).unwrap();
        // openraft's receiver: each chunk at its offset (here one out of order).
        data.seek(SeekFrom::Start(5)).await.unwrap();
        data.write_all(b"world").await.unwrap();
        data.seek(SeekFrom::Start(0)).await.unwrap();
        data.write_all(b"hello").await.unwrap();
        data.shutdown().await.unwrap();
        let mut file = data.into_std().await.unwrap();
        let mut all = String::new();
        std::io::Read::read_to_string(&mut file, &mut all).unwrap();
        assert_eq!(all, "helloworld");
    }

    #[test]
    fn each_received_snapshot_has_a_file_of_its_own_and_leftovers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (receiving_path(dir.path(), 0), receiving_path(dir.path(), 1));
        assert_ne!(a, b);
        for p in [&a, &b] {
            std::fs::write(p, b"part of a snapshot").unwrap();
        }
        std::fs::write(dir.path().join("snapshot.bin"), b"kept").unwrap();
        remove_received(dir.path()).unwrap();
        assert!(!a.exists() && !b.exists(), "a received file was left");
        assert!(
            dir.path().join("snapshot.bin").exists(),
            "another file was removed"
        );
    }
}
