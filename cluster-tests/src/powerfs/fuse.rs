//! The FUSE request handlers: each decodes its request, calls [`State`] under the shared lock
//! and replies.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::SystemTime;

use fuser::*;

use super::state::{Handle, State};
use super::tree::{Body, DirData, FileData, Meta};
use super::{Shared, BLOCK, BLOCK_U64, MAX_FILE_SIZE, MAX_NAME_LEN, TTL};

pub(super) fn system_time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The FUSE request handlers; all state is behind the shared mutex.
pub(super) struct Server {
    pub(super) shared: Arc<Shared>,
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
