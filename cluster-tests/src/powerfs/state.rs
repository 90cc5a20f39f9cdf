//! The filesystem's state: the current and the durable tree, open handles, and every
//! operation the FUSE handlers call, including the fsync that commits and the power cut that
//! goes back.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo, RenameFlags};

use super::tree::{Body, DirData, FileData, Meta, Node, Tree};
use super::{CutReport, BLOCK, BLOCK_U64, MAX_FILE_SIZE, MAX_NAME_LEN, ROOT};

/// An open file or directory.
pub(super) enum Handle {
    File {
        ino: u64,
    },
    /// The listing is taken when a read starts at offset 0, so offsets stay valid while the
    /// directory changes.
    Dir {
        ino: u64,
        listing: Vec<(u64, FileType, OsString)>,
    },
}

pub(super) struct State {
    pub(super) current: Tree,
    pub(super) durable: Tree,
    /// The namespace changed since its last commit.
    pub(super) namespace_dirty: bool,
    pub(super) next_ino: u64,
    pub(super) next_fh: u64,
    /// Handles are never reused; a cut clears them, so an old handle is unknown (`EIO`).
    pub(super) handles: HashMap<u64, Handle>,
    /// Open file handles per inode, to keep unlinked files alive.
    pub(super) open_files: HashMap<u64, u32>,
}

impl State {
    pub(super) fn new() -> State {
        let root = Node {
            meta: Meta::new(0o755, 0, 0),
            linked: true,
            body: Body::Dir(DirData {
                parent: ROOT,
                entries: BTreeMap::new(),
            }),
        };
        let tree = Tree {
            nodes: HashMap::from([(ROOT, root)]),
        };
        State {
            current: tree.clone(),
            durable: tree,
            namespace_dirty: false,
            next_ino: ROOT + 1,
            next_fh: 1,
            handles: HashMap::new(),
            open_files: HashMap::new(),
        }
    }

    pub(super) fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let node = self.current.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (size, blocks, nlink) = match &node.body {
            Body::File(f) => (
                f.size,
                f.blocks.len() as u64 * (BLOCK_U64 / 512),
                u32::from(node.linked),
            ),
            Body::Dir(d) => {
                let subdirs = d
                    .entries
                    .values()
                    .filter(|&&c| self.current.is_dir(c))
                    .count();
                (
                    BLOCK_U64,
                    BLOCK_U64 / 512,
                    2u32.saturating_add(u32::try_from(subdirs).unwrap_or(u32::MAX)),
                )
            }
        };
        let m = &node.meta;
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks,
            atime: m.atime,
            mtime: m.mtime,
            ctime: m.ctime,
            crtime: m.crtime,
            kind: node.kind(),
            perm: m.perm,
            nlink,
            uid: m.uid,
            gid: m.gid,
            rdev: 0,
            blksize: BLOCK as u32,
            flags: 0,
        })
    }

    pub(super) fn file_handle(&self, fh: FileHandle, ino: u64) -> Result<(), Errno> {
        match self.handles.get(&fh.0) {
            Some(Handle::File { ino: h }) if *h == ino => Ok(()),
            Some(_) => Err(Errno::EBADF),
            None => Err(Errno::EIO),
        }
    }

    pub(super) fn touch_dir(&mut self, ino: u64) {
        if let Some(node) = self.current.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            node.meta.mtime = now;
            node.meta.ctime = now;
        }
    }

    pub(super) fn make_node(
        &mut self,
        parent: u64,
        name: &OsStr,
        meta: Meta,
        body: Body,
    ) -> Result<u64, Errno> {
        check_name(name)?;
        let dir = self.current.dir(parent)?;
        if dir.entries.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.current.nodes.insert(
            ino,
            Node {
                meta,
                linked: true,
                body,
            },
        );
        self.current
            .dir_mut(parent)?
            .entries
            .insert(name.to_os_string(), ino);
        self.touch_dir(parent);
        self.namespace_dirty = true;
        Ok(ino)
    }

    /// Drops a node that lost its name: a directory at once, a file when no handle has it open.
    pub(super) fn unlinked(&mut self, ino: u64) {
        let open = self.open_files.get(&ino).copied().unwrap_or(0);
        match self.current.nodes.get_mut(&ino) {
            Some(node) if matches!(node.body, Body::File(_)) && open > 0 => node.linked = false,
            Some(_) => {
                self.current.nodes.remove(&ino);
            }
            None => {}
        }
    }

    pub(super) fn remove(
        &mut self,
        parent: u64,
        name: &OsStr,
        want_dir: bool,
    ) -> Result<(), Errno> {
        let ino = self.current.child(parent, name)?;
        match (
            &self.current.nodes.get(&ino).ok_or(Errno::ENOENT)?.body,
            want_dir,
        ) {
            (Body::Dir(_), false) => return Err(Errno::EISDIR),
            (Body::File(_), true) => return Err(Errno::ENOTDIR),
            (Body::Dir(d), true) if !d.entries.is_empty() => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        self.current.dir_mut(parent)?.entries.remove(name);
        self.unlinked(ino);
        self.touch_dir(parent);
        self.namespace_dirty = true;
        Ok(())
    }

    pub(super) fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let known = RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_NOREPLACE;
        if !known.contains(flags) || (exchange && noreplace) {
            return Err(Errno::EINVAL);
        }
        check_name(new_name)?;
        let src = self.current.child(parent, name)?;
        let dst = self.current.dir(new_parent)?.entries.get(new_name).copied();
        let src_is_dir = self.current.is_dir(src);
        if exchange {
            let dst = dst.ok_or(Errno::ENOENT)?;
            if src == dst {
                return Ok(());
            }
            let dst_is_dir = self.current.is_dir(dst);
            if (src_is_dir && self.current.is_ancestor(src, new_parent))
                || (dst_is_dir && self.current.is_ancestor(dst, parent))
            {
                return Err(Errno::EINVAL);
            }
            self.current
                .dir_mut(parent)?
                .entries
                .insert(name.to_os_string(), dst);
            self.current
                .dir_mut(new_parent)?
                .entries
                .insert(new_name.to_os_string(), src);
            if src_is_dir {
                self.current.dir_mut(src)?.parent = new_parent;
            }
            if dst_is_dir {
                self.current.dir_mut(dst)?.parent = parent;
            }
        } else {
            if dst == Some(src) {
                return Ok(());
            }
            if src_is_dir && self.current.is_ancestor(src, new_parent) {
                return Err(Errno::EINVAL);
            }
            if let Some(dst) = dst {
                if noreplace {
                    return Err(Errno::EEXIST);
                }
                match (
                    src_is_dir,
                    &self.current.nodes.get(&dst).ok_or(Errno::ENOENT)?.body,
                ) {
                    (true, Body::File(_)) => return Err(Errno::ENOTDIR),
                    (false, Body::Dir(_)) => return Err(Errno::EISDIR),
                    (true, Body::Dir(d)) if !d.entries.is_empty() => return Err(Errno::ENOTEMPTY),
                    _ => {}
                }
            }
            self.current.dir_mut(parent)?.entries.remove(name);
            let replaced = self
                .current
                .dir_mut(new_parent)?
                .entries
                .insert(new_name.to_os_string(), src);
            if let Some(replaced) = replaced {
                self.unlinked(replaced);
            }
            if src_is_dir {
                self.current.dir_mut(src)?.parent = new_parent;
            }
        }
        if let Some(node) = self.current.nodes.get_mut(&src) {
            node.meta.ctime = SystemTime::now();
        }
        self.touch_dir(parent);
        self.touch_dir(new_parent);
        self.namespace_dirty = true;
        Ok(())
    }

    pub(super) fn open_file(&mut self, ino: u64) -> Result<u64, Errno> {
        self.current.file_mut(ino)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle::File { ino });
        *self.open_files.entry(ino).or_insert(0) += 1;
        Ok(fh)
    }

    pub(super) fn release(&mut self, fh: FileHandle) {
        let Some(handle) = self.handles.remove(&fh.0) else {
            return;
        };
        let Handle::File { ino } = handle else {
            return;
        };
        let open = self.open_files.entry(ino).or_insert(0);
        *open = open.saturating_sub(1);
        if *open == 0 {
            self.open_files.remove(&ino);
            if self.current.nodes.get(&ino).is_some_and(|n| !n.linked) {
                self.current.nodes.remove(&ino);
            }
        }
    }

    pub(super) fn write(
        &mut self,
        ino: u64,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
    ) -> Result<(), Errno> {
        self.file_handle(fh, ino)?;
        offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        if data.is_empty() {
            return Ok(());
        }
        let node = self.current.nodes.get_mut(&ino).ok_or(Errno::EIO)?;
        let Body::File(file) = &mut node.body else {
            return Err(Errno::EISDIR);
        };
        file.write(offset, data);
        let now = SystemTime::now();
        node.meta.mtime = now;
        node.meta.ctime = now;
        Ok(())
    }

    pub(super) fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        self.current.file_mut(ino)?.set_size(size);
        Ok(())
    }

    pub(super) fn fallocate(
        &mut self,
        ino: u64,
        fh: FileHandle,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> Result<(), Errno> {
        self.file_handle(fh, ino)?;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        let file = self.current.file_mut(ino)?;
        // Holes already read as zeros; there is no space to reserve.
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > file.size {
            file.set_size(end);
        }
        Ok(())
    }

    /// Makes the current namespace the durable one. Files new to it start with empty durable
    /// content: only their own fsync makes their data durable.
    pub(super) fn commit_namespace(&mut self) {
        let current = &self.current.nodes;
        self.durable
            .nodes
            .retain(|ino, _| current.get(ino).is_some_and(|n| n.linked));
        for (&ino, node) in current {
            if !node.linked {
                continue;
            }
            match &node.body {
                Body::Dir(_) => {
                    self.durable.nodes.insert(ino, node.clone());
                }
                Body::File(_) => match self.durable.nodes.get_mut(&ino) {
                    Some(durable) => durable.meta = node.meta.clone(),
                    None => {
                        self.durable.nodes.insert(
                            ino,
                            Node {
                                meta: node.meta.clone(),
                                linked: true,
                                body: Body::File(FileData::default()),
                            },
                        );
                    }
                },
            }
        }
        self.namespace_dirty = false;
    }

    pub(super) fn fsync_file(&mut self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
        self.file_handle(fh, ino)?;
        let linked = self.current.nodes.get(&ino).is_some_and(|n| n.linked);
        if self.namespace_dirty || (linked && !self.durable.nodes.contains_key(&ino)) {
            self.commit_namespace();
        }
        let file = self.current.file_mut(ino).map_err(|_| Errno::EIO)?;
        match self.durable.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::File(durable)) => file.commit_into(durable),
            // Unlinked and committed: nothing of it survives a cut.
            _ => file.dirty.clear(),
        }
        Ok(())
    }

    pub(super) fn fsync_dir(&mut self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
        match self.handles.get(&fh.0) {
            Some(Handle::Dir { ino: h, .. }) if *h == ino => {}
            Some(_) => return Err(Errno::EBADF),
            None => return Err(Errno::EIO),
        }
        if self.namespace_dirty {
            self.commit_namespace();
        }
        Ok(())
    }

    pub(super) fn cut_power(&mut self) -> CutReport {
        let mut report = CutReport::default();
        for (ino, node) in &self.current.nodes {
            let Body::File(file) = &node.body else {
                continue;
            };
            report.bytes_dropped += file.dirty_bytes();
            let reverted = match self.durable.nodes.get(ino).map(|n| &n.body) {
                Some(Body::File(durable)) => !file.dirty.is_empty() || durable.size != file.size,
                _ => file.size > 0,
            };
            report.files_reverted += u64::from(reverted);
        }
        report.entries_reverted = entries_differing(&self.current, &self.durable);

        // New numbers for every inode but the root: the kernel's dentries and inodes from
        // before the cut all fail revalidation instead of showing stale sizes or aliases.
        let mut olds: Vec<u64> = self.durable.nodes.keys().copied().collect();
        olds.sort_unstable();
        let mut renumber = HashMap::with_capacity(olds.len());
        for old in olds {
            let new = if old == ROOT {
                ROOT
            } else {
                self.next_ino += 1;
                self.next_ino - 1
            };
            renumber.insert(old, new);
        }
        let map = |ino: u64| renumber.get(&ino).copied().unwrap_or(ROOT);
        let nodes = std::mem::take(&mut self.durable.nodes)
            .into_iter()
            .map(|(ino, mut node)| {
                if let Body::Dir(d) = &mut node.body {
                    d.parent = map(d.parent);
                    for child in d.entries.values_mut() {
                        *child = map(*child);
                    }
                }
                (map(ino), node)
            })
            .collect();
        self.durable.nodes = nodes;
        self.current = self.durable.clone();
        self.namespace_dirty = false;
        self.handles.clear();
        self.open_files.clear();
        report
    }
}

/// Directory entries (name -> inode) present in one tree and not the same in the other.
pub(super) fn entries_differing(a: &Tree, b: &Tree) -> u64 {
    let empty = BTreeMap::new();
    let mut dirs: BTreeSet<u64> = BTreeSet::new();
    for tree in [a, b] {
        dirs.extend(
            tree.nodes
                .iter()
                .filter(|(_, n)| matches!(n.body, Body::Dir(_)))
                .map(|(&i, _)| i),
        );
    }
    let mut count = 0;
    for dir in dirs {
        let ea = a.dir(dir).map_or(&empty, |d| &d.entries);
        let eb = b.dir(dir).map_or(&empty, |d| &d.entries);
        count += ea.iter().filter(|(k, v)| eb.get(*k) != Some(v)).count() as u64;
        count += eb.keys().filter(|k| !ea.contains_key(*k)).count() as u64;
    }
    count
}

pub(super) fn check_name(name: &OsStr) -> Result<(), Errno> {
    let bytes = name.as_bytes();
    if bytes.len() > MAX_NAME_LEN {
        return Err(Errno::ENAMETOOLONG);
    }
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}
