//! `powerfs`: an in-memory FUSE filesystem that loses everything not fsynced when the power is
//! cut (the LazyFS design). The cluster tests and the chaos harness mount one under each store
//! member's data dir, kill the member (kill -9, waited), call [`PowerFs::cut_power`] and restart
//! it: what the member finds is exactly what it made durable.
//!
//! # What is durable
//! - Every regular file has a *current* content (what reads see) and a *durable* content. A file's
//!   size goes with its data: it becomes durable only through that file's fsync.
//! - The namespace (which directory entries exist and what they name, with each inode's mode
//!   and owner; times ride along) also has a current and a durable version.
//! - `fsync` and `fdatasync` of a file make that file's current content durable and commit the
//!   whole current namespace, as ext4's journal commit (which is global) does. A write through
//!   a descriptor opened with `O_SYNC` or `O_DSYNC` is followed by the same commit.
//! - `fsyncdir` commits the namespace only: a file created and listed by it comes back empty
//!   (size 0) unless the file itself was fsynced, as with ext4's delayed allocation.
//! - `sync(2)` and `syncfs(2)` make nothing durable: the kernel does not pass them to FUSE.
//!
//! [`PowerFs::cut_power`] returns everything to its durable version: each file's content and
//! size, the namespace (files created and never committed disappear, unlinked files come back,
//! renames are undone). Handles opened before the cut fail with `EIO`, and every inode except
//! the root gets a new number, so no kernel cache (dentries, inode sizes) outlives the cut.
//!
//! # Kernel caches
//! Entries and attributes are replied with a zero TTL and files are opened with
//! `FOPEN_DIRECT_IO` (no page cache, so no shared writable `mmap`; `pread`/`pwrite` are fine);
//! the writeback cache is never requested. Every read and every lookup reaches this process.
//!
//! # Cost
//! File data lives in 4 KiB blocks, shared by `Arc` between the current and the durable
//! content. A file tracks the blocks changed since its last fsync; the fsync copies only those
//! blocks' `Arc`s, and the next write to a shared block copies that one block. A cut clones the
//! durable block maps (`Arc` clones). Holes read as zeros and take no memory.
//!
//! Symbolic and hard links are refused (`EPERM`), extended attributes are not supported, and
//! file locks are left to the kernel.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs::OpenOptions;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackgroundSession, Config, Errno, FileAttr, FileHandle, FileType, Filesystem,
    FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, SessionACL, TimeOrNow, WriteFlags,
};

/// Size of a data block: the unit of copy-on-write and of dirty tracking.
const BLOCK: usize = 4096;
const BLOCK_U64: u64 = BLOCK as u64;
/// Largest file size accepted (16 TiB); holes cost nothing, so this only guards arithmetic.
const MAX_FILE_SIZE: u64 = 1 << 44;
const MAX_NAME_LEN: usize = 255;
const ROOT: u64 = 1;
/// Zero: the kernel must ask again every time, so a cut is seen at once.
const TTL: Duration = Duration::ZERO;
/// Server threads; requests serialize on one mutex, the second thread overlaps kernel copies.
const SERVER_THREADS: usize = 2;

type Block = Arc<[u8; BLOCK]>;

/// Why powerfs cannot run on this machine, if it cannot: it needs root (it mounts with the
/// mount system call) and a usable `/dev/fuse`.
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!(
            "powerfs needs root to mount FUSE with the mount system call; this process runs as \
             uid {euid}"
        ));
    }
    match OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => Ok(()),
        Err(e) => Err(format!(
            "powerfs cannot open /dev/fuse ({e}); load the fuse module, or give the container \
             the device (--device /dev/fuse)"
        )),
    }
}

/// What a power cut threw away.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutReport {
    /// File data written since its file's last fsync, counted in whole 4 KiB blocks (clipped to
    /// the file's size).
    pub bytes_dropped: u64,
    /// Files whose content or size went back to their durable version, or that vanished with
    /// data in them.
    pub files_reverted: u64,
    /// Directory entries that were added, removed or repointed since the namespace's last
    /// commit.
    pub entries_reverted: u64,
}

/// A mounted powerfs. Dropping it unmounts the filesystem (lazily, if something still uses it).
pub struct PowerFs {
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// The mountpoint with symlinks resolved, as the kernel knows it.
    canonical: PathBuf,
    /// The device number of the mounted filesystem, to tell whether it is still mounted.
    dev: u64,
}

impl std::fmt::Debug for PowerFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerFs")
            .field("mountpoint", &self.mountpoint)
            .field("fsyncs", &self.fsyncs())
            .finish_non_exhaustive()
    }
}

impl PowerFs {
    /// Mounts an empty powerfs at `mountpoint`, creating the directory if it is missing. The
    /// filesystem is served by background threads until the handle is dropped.
    pub fn mount(mountpoint: &Path) -> io::Result<PowerFs> {
        available().map_err(|why| io::Error::new(io::ErrorKind::Unsupported, why))?;
        std::fs::create_dir_all(mountpoint)?;
        let canonical = mountpoint.canonicalize()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new()),
            fsyncs: AtomicU64::new(0),
        });
        let mut config = Config::default();
        config.mount_options = vec![MountOption::FSName("rkube-powerfs".to_string())];
        // allow_other in the kernel, and the server admits root and the owner (root): root
        // processes with any gid can use the mount.
        config.acl = SessionACL::RootAndOwner;
        config.n_threads = Some(SERVER_THREADS);
        let server = Server {
            shared: Arc::clone(&shared),
        };
        // The session has answered the kernel's INIT when this returns, so the mount is usable.
        let session = fuser::spawn_mount(server, &canonical, &config)?;
        let mut fs = PowerFs {
            shared,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
            canonical,
            dev: 0,
        };
        // On error, dropping `fs` unmounts.
        fs.dev = std::fs::metadata(&fs.canonical)?.dev();
        Ok(fs)
    }

    /// Returns every file and the namespace to their durable versions. Call it after the
    /// processes using the mount were killed and waited for; a request that still arrives is
    /// served before or after the cut, and handles from before the cut fail with `EIO`.
    pub fn cut_power(&self) -> CutReport {
        self.shared.lock().cut_power()
    }

    /// `fsync`, `fdatasync` and directory fsync calls since the mount.
    pub fn fsyncs(&self) -> u64 {
        self.shared.fsyncs.load(Ordering::Relaxed)
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn still_mounted(&self) -> bool {
        // An error (ENOTCONN from a dead server) counts as mounted: detaching is the cure.
        std::fs::metadata(&self.canonical).map_or(true, |m| m.dev() == self.dev)
    }
}

impl Drop for PowerFs {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // fuser unmounts without MNT_DETACH, which fails while a file is open or a process has
        // its cwd inside; the detach below covers that case.
        drop(session);
        if !self.still_mounted() {
            return;
        }
        let Ok(path) = CString::new(self.canonical.as_os_str().as_bytes()) else {
            return;
        };
        // SAFETY: `path` is a valid NUL-terminated string that outlives the call.
        unsafe {
            libc::umount2(path.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// What the handle and the server threads share.
struct Shared {
    state: Mutex<State>,
    fsyncs: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing in `State` panics halfway through an update, so a poisoned lock still holds
        // a consistent state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Clone)]
struct Meta {
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
}

impl Meta {
    fn new(perm: u32, uid: u32, gid: u32) -> Meta {
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
struct FileData {
    blocks: BTreeMap<u64, Block>,
    size: u64,
    dirty: BTreeSet<u64>,
}

impl FileData {
    fn read(&self, offset: u64, len: u32) -> Vec<u8> {
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
    fn write(&mut self, offset: u64, data: &[u8]) {
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

    fn set_size(&mut self, size: u64) {
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
    fn commit_into(&mut self, durable: &mut FileData) {
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
    fn dirty_bytes(&self) -> u64 {
        self.dirty
            .iter()
            .filter(|idx| self.blocks.contains_key(idx))
            .map(|&idx| self.size.saturating_sub(idx * BLOCK_U64).min(BLOCK_U64))
            .sum()
    }
}

#[derive(Clone)]
struct DirData {
    parent: u64,
    entries: BTreeMap<OsString, u64>,
}

#[derive(Clone)]
enum Body {
    File(FileData),
    Dir(DirData),
}

#[derive(Clone)]
struct Node {
    meta: Meta,
    /// False for a file that was unlinked while open: it lives until its last handle closes.
    linked: bool,
    body: Body,
}

impl Node {
    fn kind(&self) -> FileType {
        match self.body {
            Body::File(_) => FileType::RegularFile,
            Body::Dir(_) => FileType::Directory,
        }
    }
}

/// All inodes of one version of the filesystem, by number.
#[derive(Clone)]
struct Tree {
    nodes: HashMap<u64, Node>,
}

impl Tree {
    fn dir(&self, ino: u64) -> Result<&DirData, Errno> {
        match self.nodes.get(&ino).map(|n| &n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(Body::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> Result<&mut DirData, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::Dir(d)) => Ok(d),
            Some(Body::File(_)) => Err(Errno::ENOTDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut FileData, Errno> {
        match self.nodes.get_mut(&ino).map(|n| &mut n.body) {
            Some(Body::File(f)) => Ok(f),
            Some(Body::Dir(_)) => Err(Errno::EISDIR),
            None => Err(Errno::ENOENT),
        }
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<u64, Errno> {
        self.dir(parent)?
            .entries
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }

    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes.get(&ino).map(|n| &n.body), Some(Body::Dir(_)))
    }

    /// Whether `ancestor` is `ino` or one of its parents.
    fn is_ancestor(&self, ancestor: u64, mut ino: u64) -> bool {
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

/// An open file or directory.
enum Handle {
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

struct State {
    current: Tree,
    durable: Tree,
    /// The namespace changed since its last commit.
    namespace_dirty: bool,
    next_ino: u64,
    next_fh: u64,
    /// Handles are never reused; a cut clears them, so an old handle is unknown (`EIO`).
    handles: HashMap<u64, Handle>,
    /// Open file handles per inode, to keep unlinked files alive.
    open_files: HashMap<u64, u32>,
}

impl State {
    fn new() -> State {
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

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
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

    fn file_handle(&self, fh: FileHandle, ino: u64) -> Result<(), Errno> {
        match self.handles.get(&fh.0) {
            Some(Handle::File { ino: h }) if *h == ino => Ok(()),
            Some(_) => Err(Errno::EBADF),
            None => Err(Errno::EIO),
        }
    }

    fn touch_dir(&mut self, ino: u64) {
        if let Some(node) = self.current.nodes.get_mut(&ino) {
            let now = SystemTime::now();
            node.meta.mtime = now;
            node.meta.ctime = now;
        }
    }

    fn make_node(
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
    fn unlinked(&mut self, ino: u64) {
        let open = self.open_files.get(&ino).copied().unwrap_or(0);
        match self.current.nodes.get_mut(&ino) {
            Some(node) if matches!(node.body, Body::File(_)) && open > 0 => node.linked = false,
            Some(_) => {
                self.current.nodes.remove(&ino);
            }
            None => {}
        }
    }

    fn remove(&mut self, parent: u64, name: &OsStr, want_dir: bool) -> Result<(), Errno> {
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

    fn rename(
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

    fn open_file(&mut self, ino: u64) -> Result<u64, Errno> {
        self.current.file_mut(ino)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, Handle::File { ino });
        *self.open_files.entry(ino).or_insert(0) += 1;
        Ok(fh)
    }

    fn release(&mut self, fh: FileHandle) {
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

    fn write(&mut self, ino: u64, fh: FileHandle, offset: u64, data: &[u8]) -> Result<(), Errno> {
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

    fn set_size(&mut self, ino: u64, size: u64) -> Result<(), Errno> {
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        self.current.file_mut(ino)?.set_size(size);
        Ok(())
    }

    fn fallocate(
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
    fn commit_namespace(&mut self) {
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

    fn fsync_file(&mut self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
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

    fn fsync_dir(&mut self, ino: u64, fh: FileHandle) -> Result<(), Errno> {
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

    fn cut_power(&mut self) -> CutReport {
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
fn entries_differing(a: &Tree, b: &Tree) -> u64 {
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

fn check_name(name: &OsStr) -> Result<(), Errno> {
    let bytes = name.as_bytes();
    if bytes.len() > MAX_NAME_LEN {
        return Err(Errno::ENAMETOOLONG);
    }
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

fn system_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The FUSE request handlers; all state is behind the shared mutex.
struct Server {
    shared: Arc<Shared>,
}

impl Server {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }
}

impl Filesystem for Server {
    /// Files are served with direct I/O; a shared mmap of one (etcd's bbolt maps its database)
    /// is allowed only when the kernel is asked for it (Linux 6.6 and later).
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = self.lock();
        match st
            .current
            .child(parent.0, name)
            .and_then(|ino| st.attr(ino))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.lock();
        if fh.is_some_and(|fh| !st.handles.contains_key(&fh.0)) {
            return reply.error(Errno::EIO);
        }
        match st.attr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        let ino = ino.0;
        if fh.is_some_and(|fh| !st.handles.contains_key(&fh.0)) {
            return reply.error(Errno::EIO);
        }
        if !st.current.nodes.contains_key(&ino) {
            return reply.error(Errno::ENOENT);
        }
        if let Some(size) = size {
            if let Err(e) = st.set_size(ino, size) {
                return reply.error(e);
            }
        }
        let now = SystemTime::now();
        let mut namespace_changed = false;
        if let Some(node) = st.current.nodes.get_mut(&ino) {
            let m = &mut node.meta;
            if let Some(mode) = mode {
                m.perm = (mode & 0o7777) as u16;
                namespace_changed = true;
            }
            if let Some(uid) = uid {
                m.uid = uid;
                namespace_changed = true;
            }
            if let Some(gid) = gid {
                m.gid = gid;
                namespace_changed = true;
            }
            if let Some(t) = atime {
                m.atime = system_time(t);
            }
            if let Some(t) = mtime {
                m.mtime = system_time(t);
            } else if size.is_some() {
                m.mtime = now;
            }
            m.ctime = ctime.unwrap_or(now);
        }
        st.namespace_dirty |= namespace_changed;
        match st.attr(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut st = self.lock();
        let meta = Meta::new(mode, req.uid(), req.gid());
        match st
            .make_node(parent.0, name, meta, Body::File(FileData::default()))
            .and_then(|ino| st.attr(ino))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut st = self.lock();
        let meta = Meta::new(mode, req.uid(), req.gid());
        let body = Body::Dir(DirData {
            parent: parent.0,
            entries: BTreeMap::new(),
        });
        match st
            .make_node(parent.0, name, meta, body)
            .and_then(|ino| st.attr(ino))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().remove(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().remove(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        match self
            .lock()
            .rename(parent.0, name, newparent.0, newname, flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.lock().open_file(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut st = self.lock();
        if let Err(e) = st.file_handle(fh, ino.0) {
            return reply.error(e);
        }
        match st.current.file_mut(ino.0) {
            Ok(file) => reply.data(&file.read(offset, size)),
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Ok(written) = u32::try_from(data.len()) else {
            return reply.error(Errno::EINVAL);
        };
        let mut st = self.lock();
        let mut result = st.write(ino.0, fh, offset, data);
        // O_SYNC includes the O_DSYNC bit.
        if result.is_ok() && flags.0 & libc::O_DSYNC != 0 {
            result = st.fsync_file(ino.0, fh);
        }
        match result {
            Ok(()) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.lock().release(fh);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        match self.lock().fsync_file(ino.0, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        if let Err(e) = st.current.dir(ino.0) {
            return reply.error(e);
        }
        let fh = st.next_fh;
        st.next_fh += 1;
        st.handles.insert(
            fh,
            Handle::Dir {
                ino: ino.0,
                listing: Vec::new(),
            },
        );
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let listing = match st.handles.get_mut(&fh.0) {
            Some(Handle::Dir { ino: h, listing }) if *h == ino.0 => listing,
            Some(_) => return reply.error(Errno::EBADF),
            None => return reply.error(Errno::EIO),
        };
        if offset == 0 {
            let dir = match st.current.dir(ino.0) {
                Ok(dir) => dir,
                Err(e) => return reply.error(e),
            };
            listing.clear();
            listing.push((ino.0, FileType::Directory, OsString::from(".")));
            listing.push((dir.parent, FileType::Directory, OsString::from("..")));
            for (name, &child) in &dir.entries {
                if let Some(node) = st.current.nodes.get(&child) {
                    listing.push((child, node.kind(), name.clone()));
                }
            }
        }
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (child, kind, name)) in listing.iter().enumerate().skip(skip) {
            // The offset of an entry is where the next read starts.
            if reply.add(INodeNo(*child), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.lock().handles.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.fsyncs.fetch_add(1, Ordering::Relaxed);
        match self.lock().fsync_dir(ino.0, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (used_blocks, files) = {
            let st = self.lock();
            let used = st
                .current
                .nodes
                .values()
                .map(|n| match &n.body {
                    Body::File(f) => f.blocks.len() as u64,
                    Body::Dir(_) => 1,
                })
                .sum::<u64>();
            (used, st.current.nodes.len() as u64)
        };
        // Plenty of room: 16 TiB and a billion inodes.
        let total_blocks = MAX_FILE_SIZE / BLOCK_U64;
        let total_files = 1 << 30;
        reply.statfs(
            total_blocks,
            total_blocks.saturating_sub(used_blocks),
            total_blocks.saturating_sub(used_blocks),
            total_files,
            total_files.saturating_sub(files),
            BLOCK as u32,
            MAX_NAME_LEN as u32,
            BLOCK as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Only root uses the mount, and root may do anything.
        if self.lock().current.nodes.contains_key(&ino.0) {
            reply.ok();
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        let meta = Meta::new(mode, req.uid(), req.gid());
        let created = st
            .make_node(parent.0, name, meta, Body::File(FileData::default()))
            .and_then(|ino| Ok((st.attr(ino)?, st.open_file(ino)?)));
        match created {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.lock().fallocate(ino.0, fh, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use super::*;

    /// A mounted powerfs in a fresh temporary directory; unmounts before the directory goes.
    struct Fixture {
        fs: PowerFs,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            if let Err(why) = available() {
                panic!("powerfs tests cannot run here: {why}");
            }
            let dir = tempfile::tempdir().expect("create a temporary directory");
            let fs = PowerFs::mount(&dir.path().join("mnt")).expect("mount powerfs");
            Fixture { fs, _dir: dir }
        }

        fn path(&self, name: &str) -> PathBuf {
            self.fs.mountpoint().join(name)
        }
    }

    fn write_file(path: &Path, data: &[u8], sync: bool) -> io::Result<()> {
        let mut f = File::create(path)?;
        f.write_all(data)?;
        if sync {
            f.sync_all()?;
        }
        Ok(())
    }

    fn append(path: &Path, data: &[u8], sync: bool) -> io::Result<()> {
        let mut f = OpenOptions::new().append(true).open(path)?;
        f.write_all(data)?;
        if sync {
            f.sync_data()?;
        }
        Ok(())
    }

    fn sync_dir(path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn exists(path: &Path) -> bool {
        fs::symlink_metadata(path).is_ok()
    }

    fn errno(r: io::Result<impl Sized>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    struct Scenario {
        name: &'static str,
        before_cut: fn(&Path) -> io::Result<()>,
        after_cut: fn(&Path),
    }

    #[test]
    fn cut_keeps_what_was_made_durable_and_nothing_else() {
        let scenarios = [
            Scenario {
                name: "synced data survives, an unsynced append is dropped",
                before_cut: |m| {
                    write_file(&m.join("f"), b"hello ", true)?;
                    append(&m.join("f"), b"world", false)
                },
                after_cut: |m| assert_eq!(fs::read(m.join("f")).unwrap(), b"hello "),
            },
            Scenario {
                name: "an unsynced overwrite in the middle reverts",
                before_cut: |m| {
                    write_file(&m.join("f"), &[b'a'; 3 * BLOCK], true)?;
                    let f = OpenOptions::new().write(true).open(m.join("f"))?;
                    f.write_all_at(&[b'b'; 100], 5000)
                },
                after_cut: |m| assert_eq!(fs::read(m.join("f")).unwrap(), vec![b'a'; 3 * BLOCK]),
            },
            Scenario {
                name: "a file never synced disappears, a synced one stays",
                before_cut: |m| {
                    write_file(&m.join("kept"), b"kept", true)?;
                    write_file(&m.join("lost"), b"lost", false)
                },
                after_cut: |m| {
                    assert_eq!(fs::read(m.join("kept")).unwrap(), b"kept");
                    assert!(!exists(&m.join("lost")));
                },
            },
            Scenario {
                name: "a file's fsync commits the namespace but not other files' data",
                before_cut: |m| {
                    write_file(&m.join("other"), b"unsynced", false)?;
                    write_file(&m.join("synced"), b"synced", true)
                },
                after_cut: |m| {
                    assert_eq!(fs::read(m.join("other")).unwrap(), b"");
                    assert_eq!(fs::read(m.join("synced")).unwrap(), b"synced");
                },
            },
            Scenario {
                name: "a rename committed by fsyncdir survives",
                before_cut: |m| {
                    write_file(&m.join("f"), b"data", true)?;
                    fs::rename(m.join("f"), m.join("g"))?;
                    sync_dir(m)
                },
                after_cut: |m| {
                    assert!(!exists(&m.join("f")));
                    assert_eq!(fs::read(m.join("g")).unwrap(), b"data");
                },
            },
            Scenario {
                name: "any file's fsync commits a rename",
                before_cut: |m| {
                    write_file(&m.join("f"), b"data", true)?;
                    write_file(&m.join("other"), b"other", true)?;
                    fs::rename(m.join("f"), m.join("g"))?;
                    File::open(m.join("other"))?.sync_data()
                },
                after_cut: |m| {
                    assert!(!exists(&m.join("f")));
                    assert_eq!(fs::read(m.join("g")).unwrap(), b"data");
                },
            },
            Scenario {
                name: "a rename not committed is undone",
                before_cut: |m| {
                    write_file(&m.join("f"), b"data", true)?;
                    fs::rename(m.join("f"), m.join("g"))
                },
                after_cut: |m| {
                    assert_eq!(fs::read(m.join("f")).unwrap(), b"data");
                    assert!(!exists(&m.join("g")));
                },
            },
            Scenario {
                name: "a rename over an existing file, not committed, is undone",
                before_cut: |m| {
                    write_file(&m.join("new"), b"new", true)?;
                    write_file(&m.join("old"), b"old", true)?;
                    fs::rename(m.join("new"), m.join("old"))
                },
                after_cut: |m| {
                    assert_eq!(fs::read(m.join("new")).unwrap(), b"new");
                    assert_eq!(fs::read(m.join("old")).unwrap(), b"old");
                },
            },
            Scenario {
                name: "a directory rename not committed is undone",
                before_cut: |m| {
                    fs::create_dir(m.join("d"))?;
                    write_file(&m.join("d/f"), b"in d", true)?;
                    fs::create_dir(m.join("e"))?;
                    sync_dir(m)?;
                    fs::rename(m.join("d"), m.join("e/d"))?;
                    // Make the kernel hold the moved directory's dentry.
                    fs::read(m.join("e/d/f")).map(drop)
                },
                after_cut: |m| {
                    assert_eq!(fs::read(m.join("d/f")).unwrap(), b"in d");
                    assert!(!exists(&m.join("e/d")));
                },
            },
            Scenario {
                name: "a truncate not synced reverts",
                before_cut: |m| {
                    write_file(&m.join("f"), &[7; 10_000], true)?;
                    OpenOptions::new()
                        .write(true)
                        .open(m.join("f"))?
                        .set_len(100)
                },
                after_cut: |m| assert_eq!(fs::read(m.join("f")).unwrap(), vec![7; 10_000]),
            },
            Scenario {
                name: "a synced truncate survives, and growing again reads zeros",
                before_cut: |m| {
                    write_file(&m.join("f"), &[7; 10_000], true)?;
                    let f = OpenOptions::new().write(true).open(m.join("f"))?;
                    f.set_len(100)?;
                    f.sync_all()?;
                    f.set_len(5000)?;
                    f.sync_all()
                },
                after_cut: |m| {
                    let mut want = vec![7; 100];
                    want.resize(5000, 0);
                    assert_eq!(fs::read(m.join("f")).unwrap(), want);
                },
            },
            Scenario {
                name: "an unlink not committed comes back",
                before_cut: |m| {
                    write_file(&m.join("f"), b"data", true)?;
                    fs::remove_file(m.join("f"))
                },
                after_cut: |m| assert_eq!(fs::read(m.join("f")).unwrap(), b"data"),
            },
            Scenario {
                name: "an unlink committed by fsyncdir stays done",
                before_cut: |m| {
                    write_file(&m.join("f"), b"data", true)?;
                    fs::remove_file(m.join("f"))?;
                    sync_dir(m)
                },
                after_cut: |m| assert!(!exists(&m.join("f"))),
            },
            Scenario {
                name: "mkdir survives only when committed",
                before_cut: |m| {
                    fs::create_dir(m.join("committed"))?;
                    sync_dir(m)?;
                    fs::create_dir(m.join("lost"))
                },
                after_cut: |m| {
                    assert!(fs::metadata(m.join("committed")).unwrap().is_dir());
                    assert!(!exists(&m.join("lost")));
                },
            },
            Scenario {
                name: "a synced sparse file reads zeros in its hole",
                before_cut: |m| {
                    let f = File::create(m.join("f"))?;
                    f.write_all_at(b"z", 1 << 20)?;
                    f.sync_data()
                },
                after_cut: |m| {
                    let data = fs::read(m.join("f")).unwrap();
                    assert_eq!(data.len(), (1 << 20) + 1);
                    assert!(data[..1 << 20].iter().all(|&b| b == 0));
                    assert_eq!(data[1 << 20], b'z');
                },
            },
            Scenario {
                name: "an O_DSYNC write is durable",
                before_cut: |m| {
                    let mut f = OpenOptions::new()
                        .create(true)
                        .truncate(true)
                        .write(true)
                        .custom_flags(libc::O_DSYNC)
                        .open(m.join("f"))?;
                    f.write_all(b"dsync")
                },
                after_cut: |m| assert_eq!(fs::read(m.join("f")).unwrap(), b"dsync"),
            },
        ];
        let mut failed = Vec::new();
        for s in scenarios {
            let fx = Fixture::new();
            let m = fx.fs.mountpoint();
            if let Err(e) = (s.before_cut)(m) {
                failed.push(format!("{} (before the cut: {e})", s.name));
                continue;
            }
            fx.fs.cut_power();
            if std::panic::catch_unwind(|| (s.after_cut)(m)).is_err() {
                failed.push(s.name.to_string());
            }
        }
        assert!(failed.is_empty(), "scenarios failed: {failed:#?}");
    }

    #[test]
    fn cut_report_counts_what_was_dropped() {
        let fx = Fixture::new();
        write_file(&fx.path("f"), &[1; BLOCK], true).unwrap();
        append(&fx.path("f"), &[2; 2 * BLOCK], false).unwrap();
        File::create(fx.path("empty")).unwrap();
        let report = fx.fs.cut_power();
        assert_eq!(
            report,
            CutReport {
                bytes_dropped: 2 * BLOCK_U64,
                files_reverted: 1,
                entries_reverted: 1,
            }
        );
        assert_eq!(fx.fs.cut_power(), CutReport::default());
    }

    #[test]
    fn counts_file_and_directory_fsyncs() {
        let fx = Fixture::new();
        let f = File::create(fx.path("f")).unwrap();
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        sync_dir(fx.fs.mountpoint()).unwrap();
        assert_eq!(fx.fs.fsyncs(), 3);
    }

    #[test]
    fn many_small_synced_appends_to_a_large_file() {
        const LARGE: usize = 64 << 20;
        const APPENDS: usize = 2000;
        let fx = Fixture::new();
        let path = fx.path("wal");
        let mut f = File::create(&path).unwrap();
        let chunk = vec![0xa5; 1 << 20];
        for _ in 0..LARGE / chunk.len() {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        for i in 0..APPENDS {
            f.write_all(&[(i % 251) as u8; BLOCK]).unwrap();
            f.sync_data().unwrap();
        }
        f.write_all(&[0xff; BLOCK]).unwrap();
        drop(f);

        let report = fx.fs.cut_power();
        assert_eq!(report.bytes_dropped, BLOCK_U64);
        let mut f = File::open(&path).unwrap();
        let len = f.metadata().unwrap().len();
        assert_eq!(len, (LARGE + APPENDS * BLOCK) as u64);
        let mut last = vec![0; BLOCK];
        f.seek(SeekFrom::Start(len - BLOCK_U64)).unwrap();
        f.read_exact(&mut last).unwrap();
        assert_eq!(last, vec![((APPENDS - 1) % 251) as u8; BLOCK]);
        let mut first = vec![0; 16];
        f.read_exact_at(&mut first, 0).unwrap();
        assert_eq!(first, vec![0xa5; 16]);
    }

    #[test]
    fn readdir_lists_every_entry_once() {
        let fx = Fixture::new();
        let m = fx.fs.mountpoint();
        // Long names and many entries: the listing takes several readdir calls.
        let mut want: BTreeSet<String> = (0..1500)
            .map(|i| format!("entry-with-a-rather-long-name-{i:05}"))
            .collect();
        for name in &want {
            File::create(m.join(name)).unwrap();
        }
        for d in ["dir-a", "dir-b"] {
            fs::create_dir(m.join(d)).unwrap();
            want.insert(d.to_string());
        }
        File::create(m.join("dir-a/inner")).unwrap();
        let listed: Vec<String> = fs::read_dir(m)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(listed.len(), want.len(), "an entry was listed twice");
        assert_eq!(listed.into_iter().collect::<BTreeSet<_>>(), want);
        let inner: Vec<_> = fs::read_dir(m.join("dir-a"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(inner, vec![OsString::from("inner")]);

        fx.fs.cut_power();
        assert_eq!(fs::read_dir(m).unwrap().count(), 0);
    }

    #[test]
    fn fallocate_modes() {
        let fx = Fixture::new();
        let f = File::create(fx.path("f")).unwrap();
        f.sync_all().unwrap();
        let fd = f.as_raw_fd();
        let fallocate = |mode: i32, offset: i64, len: i64| {
            // SAFETY: `fd` is an open descriptor for the duration of the call.
            let rc = unsafe { libc::fallocate(fd, mode, offset, len) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        fallocate(libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 0);
        fallocate(0, 0, 8192).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 8192);
        assert_eq!(
            errno(fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                4096
            )),
            Some(libc::EOPNOTSUPP)
        );
        assert_eq!(fs::read(fx.path("f")).unwrap(), vec![0; 8192]);
        drop(f);
        fx.fs.cut_power();
        assert_eq!(fs::metadata(fx.path("f")).unwrap().len(), 0);
    }

    #[test]
    fn handles_from_before_a_cut_fail_with_eio() {
        let fx = Fixture::new();
        write_file(&fx.path("f"), b"data", true).unwrap();
        let mut old = OpenOptions::new()
            .read(true)
            .write(true)
            .open(fx.path("f"))
            .unwrap();
        fx.fs.cut_power();
        assert_eq!(errno(old.write(b"x")), Some(libc::EIO));
        assert_eq!(errno(old.read(&mut [0; 4])), Some(libc::EIO));
        assert_eq!(errno(old.sync_all()), Some(libc::EIO));
        assert_eq!(fs::read(fx.path("f")).unwrap(), b"data");
    }

    #[test]
    fn a_stray_writer_during_a_cut_gets_eio_and_nothing_breaks() {
        let fx = Fixture::new();
        let path = fx.path("f");
        write_file(&path, b"", true).unwrap();
        let written = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (written, stop) = (Arc::clone(&written), Arc::clone(&stop));
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            std::thread::spawn(move || -> io::Result<()> {
                while !stop.load(Ordering::Relaxed) {
                    f.write_all(&[3; 100])?;
                    f.sync_data()?;
                    written.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while written.load(Ordering::Relaxed) < 20 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        fx.fs.cut_power();
        // A writer that never saw the cut is stopped here; then its result says why it ended.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !writer.is_finished() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        let ended = writer.join().expect("writer thread");
        assert_eq!(errno(ended), Some(libc::EIO));
        let len = fs::metadata(&path).unwrap().len();
        assert_eq!(len % 100, 0);
        assert!(len >= 2000, "the synced appends were lost: {len} bytes");
    }

    #[test]
    fn rename_flags() {
        let fx = Fixture::new();
        let m = fx.fs.mountpoint();
        write_file(&m.join("a"), b"a", true).unwrap();
        write_file(&m.join("b"), b"b", true).unwrap();
        let renameat2 = |from: &str, to: &str, flags: libc::c_uint| {
            let from = CString::new(m.join(from).as_os_str().as_bytes()).unwrap();
            let to = CString::new(m.join(to).as_os_str().as_bytes()).unwrap();
            // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
            let rc = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    flags,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        assert_eq!(
            errno(renameat2("a", "b", libc::RENAME_NOREPLACE)),
            Some(libc::EEXIST)
        );
        renameat2("a", "c", libc::RENAME_NOREPLACE).unwrap();
        renameat2("c", "b", libc::RENAME_EXCHANGE).unwrap();
        sync_dir(m).unwrap();
        fx.fs.cut_power();
        assert_eq!(fs::read(m.join("b")).unwrap(), b"a");
        assert_eq!(fs::read(m.join("c")).unwrap(), b"b");
        assert!(!exists(&m.join("a")));
    }

    #[test]
    fn errors_are_errno_values() {
        let fx = Fixture::new();
        let m = fx.fs.mountpoint();
        fs::create_dir_all(m.join("d/sub")).unwrap();
        File::create(m.join("f")).unwrap();
        let cases: [(&str, io::Result<()>, i32); 8] = [
            (
                "rmdir of a non-empty directory",
                fs::remove_dir(m.join("d")),
                libc::ENOTEMPTY,
            ),
            (
                "unlink of a missing file",
                fs::remove_file(m.join("missing")),
                libc::ENOENT,
            ),
            (
                "rmdir of a file",
                fs::remove_dir(m.join("f")),
                libc::ENOTDIR,
            ),
            (
                "unlink of a directory",
                fs::remove_file(m.join("d")),
                libc::EISDIR,
            ),
            (
                "mkdir of an existing name",
                fs::create_dir(m.join("f")),
                libc::EEXIST,
            ),
            (
                "a directory moved into itself",
                fs::rename(m.join("d"), m.join("d/sub/d")),
                libc::EINVAL,
            ),
            (
                "a symlink",
                std::os::unix::fs::symlink("f", m.join("link")),
                libc::EPERM,
            ),
            (
                "a hard link",
                fs::hard_link(m.join("f"), m.join("hard")),
                libc::EPERM,
            ),
        ];
        for (what, result, want) in cases {
            assert_eq!(errno(result), Some(want), "{what}");
        }
    }

    #[test]
    fn an_unlinked_open_file_stays_readable_until_closed() {
        let fx = Fixture::new();
        let mut f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(fx.path("f"))
            .unwrap();
        f.write_all(b"still here").unwrap();
        fs::remove_file(fx.path("f")).unwrap();
        let mut back = String::new();
        f.seek(SeekFrom::Start(0)).unwrap();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "still here");
        f.sync_all().unwrap();
        drop(f);
        fx.fs.cut_power();
        assert!(!exists(&fx.path("f")));
    }

    #[test]
    fn drop_unmounts_even_while_a_file_is_open() {
        for keep_open in [false, true] {
            let fx = Fixture::new();
            let mountpoint = fx.fs.mountpoint().to_path_buf();
            let mounted_dev = fs::metadata(&mountpoint).unwrap().dev();
            let open = keep_open.then(|| File::create(mountpoint.join("f")).unwrap());
            let Fixture {
                fs: powerfs,
                _dir: dir,
            } = fx;
            drop(powerfs);
            assert_ne!(
                fs::metadata(&mountpoint).unwrap().dev(),
                mounted_dev,
                "still mounted (a file open: {keep_open})"
            );
            // A detached mount keeps serving the descriptors it had.
            if let Some(mut f) = open {
                f.write_all(b"after the unmount").unwrap();
            }
            drop(dir);
        }
    }

    #[test]
    fn other_processes_use_the_mount() {
        let fx = Fixture::new();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg("printf data > f && mkdir d && mv f d/g && cat d/g")
            .current_dir(fx.fs.mountpoint())
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"data");
    }

    #[test]
    fn the_handle_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<PowerFs>();
    }
}
