//! The data dir: an exclusive lock, and the identity recorded at its creation, which the flags
//! of every later start must match.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use fs2::FileExt;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("cannot use data dir {dir}: {source}")]
    Io {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("data dir {dir} is in use by another rkube process{pid}; stop it first or pick another --data-dir")]
    Locked { dir: PathBuf, pid: String },
    #[error("data dir {dir} belongs to member {recorded:?}, but this server was started with --name {flag:?}")]
    WrongName {
        dir: PathBuf,
        recorded: String,
        flag: String,
    },
    #[error(
        "data dir {dir} belongs to another cluster (cluster id {recorded:x}); this server was started for cluster \
         {flag:x} (--initial-cluster-token). Use a fresh data dir to join this cluster"
    )]
    WrongCluster {
        dir: PathBuf,
        recorded: u64,
        flag: u64,
    },
    #[error(
        "data dir {dir} was created for peer address {recorded}, but --initial-cluster gives {flag} for this member; \
         change the address with `member update` or use the recorded one"
    )]
    WrongPeerAddr {
        dir: PathBuf,
        recorded: String,
        flag: String,
    },
    #[error("data dir {dir} has an unreadable member.json: {reason}")]
    Corrupt { dir: PathBuf, reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub name: String,
    pub member_id: u64,
    pub cluster_id: u64,
    pub peer_addr: String,
}

/// A locked data dir. The lock is held until this value is dropped.
pub struct DataDir {
    pub path: PathBuf,
    _lock: File,
    /// True when the dir had no member record yet (a new member).
    pub fresh: bool,
}

impl DataDir {
    pub fn open(path: &Path, expected: &MemberRecord) -> Result<Self, DataDirError> {
        let io = |source| DataDirError::Io {
            dir: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        let mut lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(io)?;
        if lock.try_lock_exclusive().is_err() {
            let mut pid = String::new();
            let _ = lock.read_to_string(&mut pid);
            let pid = pid.trim();
            let pid = if pid.is_empty() {
                String::new()
            } else {
                format!(" (pid {pid})")
            };
            return Err(DataDirError::Locked {
                dir: path.to_path_buf(),
                pid,
            });
        }
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        write!(lock, "{}", std::process::id()).map_err(io)?;

        let record_path = path.join("member.json");
        let fresh = match std::fs::read(&record_path) {
            Ok(bytes) => {
                let recorded: MemberRecord =
                    serde_json::from_slice(&bytes).map_err(|e| DataDirError::Corrupt {
                        dir: path.to_path_buf(),
                        reason: e.to_string(),
                    })?;
                check(path, &recorded, expected)?;
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let tmp = path.join("member.json.tmp");
                let json =
                    serde_json::to_vec_pretty(expected).map_err(|e| DataDirError::Corrupt {
                        dir: path.to_path_buf(),
                        reason: e.to_string(),
                    })?;
                crate::durable_file::replace(&record_path, &tmp, &json).map_err(io)?;
                true
            }
            Err(e) => return Err(io(e)),
        };
        Ok(Self {
            path: path.to_path_buf(),
            _lock: lock,
            fresh,
        })
    }
}

fn check(dir: &Path, recorded: &MemberRecord, flag: &MemberRecord) -> Result<(), DataDirError> {
    let dir = dir.to_path_buf();
    if recorded.cluster_id != flag.cluster_id {
        return Err(DataDirError::WrongCluster {
            dir,
            recorded: recorded.cluster_id,
            flag: flag.cluster_id,
        });
    }
    if recorded.name != flag.name {
        return Err(DataDirError::WrongName {
            dir,
            recorded: recorded.name.clone(),
            flag: flag.name.clone(),
        });
    }
    if recorded.peer_addr != flag.peer_addr {
        return Err(DataDirError::WrongPeerAddr {
            dir,
            recorded: recorded.peer_addr.clone(),
            flag: flag.peer_addr.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, cluster: u64) -> MemberRecord {
        MemberRecord {
            name: name.into(),
            member_id: 1,
            cluster_id: cluster,
            peer_addr: "127.0.0.1:2380".into(),
        }
    }

    #[test]
    fn refuses_mismatched_flags_and_a_second_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DataDir::open(dir.path(), &record("n1", 7)).expect("fresh dir opens");
        assert!(first.fresh);
        let again = DataDir::open(dir.path(), &record("n1", 7));
        assert!(
            matches!(again, Err(DataDirError::Locked { .. })),
            "second open while locked must fail"
        );
        drop(first);
        let reopened = DataDir::open(dir.path(), &record("n1", 7)).expect("reopens after unlock");
        assert!(!reopened.fresh);
        drop(reopened);
        assert!(matches!(
            DataDir::open(dir.path(), &record("n2", 7)),
            Err(DataDirError::WrongName { .. })
        ));
        assert!(matches!(
            DataDir::open(dir.path(), &record("n1", 8)),
            Err(DataDirError::WrongCluster { .. })
        ));
    }
}
