//! One version of the filesystem: inodes by number, a file's content in shared 4 KiB blocks
//! with the set changed since its last fsync, and directories' entries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{Errno, FileType};

use super::{Block, BLOCK, BLOCK_U64, ROOT};

#[derive(Clone)]
pub(super) struct Meta {
    pub(super) perm: u16,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) atime: SystemTime,
    pub(super) mtime: SystemTime,
    pub(super) ctime: SystemTime,
    pub(super) crtime: SystemTime,
}

impl Meta {
    pub(super) fn new(perm: u32, uid: u32, gid: u32) -> Meta {
        let now = SystemTime::now();
        Meta {
            perm: (perm & 0o7777) as u16,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
        }
    }
}

/// A regular file's content.
///
/// # Correctness
/// Bytes of a block past `size` are zero, so growing a file never exposes old data. In the
/// current tree, `dirty` holds every block index whose block differs from the durable
/// content's (written, zeroed or removed since the file's last fsync); in the durable tree it
/// is empty. An fsync that copies the dirty blocks therefore makes the durable content equal
/// to the current one.
#[derive(Clone, Default)]
pub(super) struct FileData {
    pub(super) blocks: BTreeMap<u64, Block>,
    pub(super) size: u64,
    pub(super) dirty: BTreeSet<u64>,
}

impl FileData {
    pub(super) fn read(&self, offset: u64, len: u32) -> Vec<u8> {
        if offset >= self.size || len == 0 {
            return Vec::new();
        }
        let end = self.size.min(offset.saturating_add(u64::from(len)));
        let mut out = vec![0u8; (end - offset) as usize];
        let first = offset / BLOCK_U64;
        let last = (end - 1) / BLOCK_U64;
        for (&idx, block) in self.blocks.range(first..=last) {
            let block_start = idx * BLOCK_U64;
            let from = offset.max(block_start);
            let to = end.min(block_start + BLOCK_U64);
            let src = &block[(from - block_start) as usize..(to - block_start) as usize];
            let dst_at = (from - offset) as usize;
            out[dst_at..dst_at + src.len()].copy_from_slice(src);
        }
        out
    }

    /// Writes `data` at `offset`; the caller has checked that the end fits `MAX_FILE_SIZE`.
    pub(super) fn write(&mut self, offset: u64, data: &[u8]) {
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let idx = pos / BLOCK_U64;
            let within = (pos % BLOCK_U64) as usize;
            let n = rest.len().min(BLOCK - within);
            if n == BLOCK {
                let mut whole = [0u8; BLOCK];
                whole.copy_from_slice(&rest[..BLOCK]);
                self.blocks.insert(idx, Arc::new(whole));
            } else {
                let block = self
                    .blocks
                    .entry(idx)
                    .or_insert_with(|| Arc::new([0u8; BLOCK]));
                Arc::make_mut(block)[within..within + n].copy_from_slice(&rest[..n]);
            }
            self.dirty.insert(idx);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.size = self.size.max(pos);
    }

    pub(super) fn set_size(&mut self, size: u64) {
        if size < self.size {
            let kept_blocks = size.div_ceil(BLOCK_U64);
            let removed = self.blocks.split_off(&kept_blocks);
            self.dirty.extend(removed.into_keys());
            let within = (size % BLOCK_U64) as usize;
            if within != 0 {
                let idx = size / BLOCK_U64;
                if let Some(block) = self.blocks.get_mut(&idx) {
                    if block[within..].iter().any(|&b| b != 0) {
                        Arc::make_mut(block)[within..].fill(0);
                        self.dirty.insert(idx);
                    }
                }
            }
        }
        self.size = size;
    }

    /// Makes `durable` equal to this content and clears the dirty set.
    pub(super) fn commit_into(&mut self, durable: &mut FileData) {
        for idx in std::mem::take(&mut self.dirty) {
            match self.blocks.get(&idx) {
                Some(block) => {
                    durable.blocks.insert(idx, Arc::clone(block));
                }
                None => {
                    durable.blocks.remove(&idx);
                }
            }
        }
        durable.size = self.size;
    }

    /// Bytes in dirty blocks that lie within the file.
    pub(super) fn dirty_bytes(&self) -> u64 {
        self.dirty
            .iter()
            .filter(|idx| self.blocks.contains_key(idx))
            .map(|&idx| self.size.saturating_sub(idx * BLOCK_U64).min(BLOCK_U64))
            .sum()
    }
}

#[derive(Clone)]
pub(super) struct DirData {
    pub(super) parent: u64,
    pub(super) entries: BTreeMap<OsString, u64>,
}

#[derive(Clone)]
pub(super) enum Body {
    File(FileData),
    Dir(DirData),
}

#[derive(Clone)]
pub(super) struct Node {
    pub(super) meta: Meta,
    /// False for a file that was unlinked while open: it lives until its last handle closes.
    pub(super) linked: bool,
    pub(super) body: Body,
}

impl Node {
    pub(super) fn kind(&self) -> FileType {
        match self.body {
            Body::File(_) => FileType::RegularFile,
            Body::Dir(_) => FileType::Directory,
        }
    }
}

/// All inodes of one version of the filesystem, by number.
#[derive(Clone)]
pub(super) struct Tree {
    pub(super) nodes: HashMap<u64, Node>,
}

impl Tree {
    pub(super) fn dir(&self, ino: u64) -> Result<&DirData, Errno> {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(Body::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub(super) fn dir_mut(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(Body::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub(super) fn file_mut(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::File(f)) => Ok(f),
            Some(Body::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    pub(super) fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .entries
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    pub(super) fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// Whether `ancestor` is `ino` or one of its parents.
    pub(super) fn is_ancestor(&self, ancestor: u64, mut ino: u64) -> bool {
        // Bounded by the node count, in case the parent links were ever broken.
        for _ in 0..=self.nodes.len() {
            if ino == ancestor {
                return true;
            }
            match self.dir(ino) {
                Ok(d) if ino != ROOT => ino = d.parent,
                _ => return false,
            }
        }
        false
    }
}
