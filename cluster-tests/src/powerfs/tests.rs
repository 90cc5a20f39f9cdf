//! The filesystem mounted for real: what reads see, what a cut keeps, and what it throws away.

use std::collections::BTreeSet;
use std::ffi::OsString;
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
