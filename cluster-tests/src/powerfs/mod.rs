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

mod fuse;
mod state;
#[cfg(test)]
mod tests;
mod tree;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};

use fuse::Server;
use state::State;

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
