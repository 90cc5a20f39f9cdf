//! openraft's storage conformance suite against [`LogStore`] and [`StateMachine`], and what the
//! suite cannot check: commands (it only builds blank and membership entries), restarts, and the
//! recovery of an interrupted snapshot install.

use std::path::Path;
use std::sync::Arc;

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{log_id, StoreBuilder, Suite};
use openraft::{EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder};

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::{logs_write, Entry, LogId, RaftStorageError, StoredMembership, TypeConfig, Vote};
use crate::error::{MvccError, StorageError};
use crate::mvcc::{
    Command, KeyRange, KeyValue, MvccStore, Op, OpResult, Output, PutRequest, PutResult,
    RangeRequest, TxnRequest, TxnResult,
};

/// A log store and a state machine sharing one sled database, as a member has them.
struct Member {
    db: sled::Db,
    log: LogStore,
    sm: StateMachine,
}

impl Member {
    fn open(dir: &Path) -> Result<Self, StorageError> {
        let db = crate::reopen_sled(&dir.join("db"))?;
        let log = LogStore::open(dir, &db, false).map_err(std::io::Error::from)?;
        let mvcc = Arc::new(MvccStore::open_dir(&db, &dir.join("db"))?);
        let sm = StateMachine::open(mvcc, dir)?;
        Ok(Self { db, log, sm })
    }
}

/// A leader and a follower, each in a directory of its own (kept alive with it).
fn leader_and_follower() -> ((tempfile::TempDir, Member), (tempfile::TempDir, Member)) {
    let member = || {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Member::open(dir.path()).expect("open");
        (dir, m)
    };
    (member(), member())
}

/// Builds a snapshot on `m`, as openraft asks for one.
/// What openraft sends a follower: the member's current snapshot, read from its file.
async fn current_snapshot(m: &mut Member) -> openraft::storage::Snapshot<TypeConfig> {
    m.sm.get_current_snapshot()
        .await
        .expect("read")
        .expect("a snapshot was built")
}

async fn build_snapshot(m: &mut Member) -> openraft::storage::Snapshot<TypeConfig> {
    m.sm.get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .expect("build")
}

/// Builds a fresh member in its own directory; the directory is the suite's guard.
struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), RaftStorageError> {
        let dir = tempfile::tempdir().map_err(logs_write)?;
        let member = Member::open(dir.path()).map_err(logs_write)?;
        Ok((dir, member.log, member.sm))
    }
}

type TheSuite = Suite<TypeConfig, LogStore, StateMachine, Builder, tempfile::TempDir>;

#[test]
fn openraft_storage_suite() {
    // The suite starts its own runtime for each case, so this is a plain test.
    TheSuite::test_all(Builder).expect("the storage passes openraft's suite");
}

fn entry(term: u64, index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
    Entry {
        log_id: log_id(term, 0, index),
        payload,
    }
}

fn put_cmd(key: &str, value: &str, lease: i64) -> Command {
    Command::Txn(TxnRequest {
        success: vec![Op::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease,
            ..Default::default()
        })],
        ..Default::default()
    })
}

fn all_keys(sm: &StateMachine) -> Vec<KeyValue> {
    let (r, _) = sm
        .mvcc()
        .range(&RangeRequest {
            range: KeyRange {
                key: vec![0],
                range_end: vec![0],
            },
            ..Default::default()
        })
        .expect("range");
    r.kvs
}

/// What a transaction of one put answers.
fn put_ok() -> Result<Output, MvccError> {
    Ok(Output::Txn(TxnResult {
        succeeded: true,
        responses: vec![OpResult::Put(PutResult::default())],
    }))
}

fn membership(voters: &[u64]) -> Membership<u64, super::Member> {
    Membership::new(vec![voters.iter().copied().collect()], ())
}

#[tokio::test]
async fn commands_apply_in_order_and_survive_a_restart() {
    // (entry, the revision it answers with, its output)
    let cases: Vec<(Entry, i64, Result<Output, MvccError>)> = vec![
        (entry(1, 1, EntryPayload::Blank), 0, Ok(Output::None)),
        (
            entry(1, 2, EntryPayload::Normal(put_cmd("a", "1", 0))),
            1,
            put_ok(),
        ),
        (
            entry(1, 3, EntryPayload::Normal(put_cmd("b", "1", 99))),
            1,
            Err(MvccError::LeaseNotFound),
        ),
        (
            entry(2, 4, EntryPayload::Membership(membership(&[1, 2, 3]))),
            1,
            Ok(Output::None),
        ),
        (
            entry(2, 5, EntryPayload::Normal(put_cmd("a", "2", 0))),
            2,
            put_ok(),
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut m = Member::open(dir.path()).expect("open");
        for (e, revision, output) in &cases {
            let got = m.sm.apply([e.clone()]).await.expect("apply");
            assert_eq!(got.len(), 1, "one answer per entry");
            assert_eq!(got[0].revision, *revision, "{}", e.log_id);
            assert_eq!(&got[0].output, output, "{}", e.log_id);
            let (applied, _) = m.sm.applied_state().await.expect("applied state");
            assert_eq!(applied, Some(e.log_id), "a refused command is applied too");
        }
        m.db.flush().expect("flush");
    }
    let mut m = Member::open(dir.path()).expect("reopen");
    let (applied, members) = m.sm.applied_state().await.expect("applied state");
    assert_eq!(applied, Some(log_id(2, 0, 5)));
    assert_eq!(
        members,
        StoredMembership::new(Some(log_id(2, 0, 4)), membership(&[1, 2, 3]))
    );
    assert_eq!(m.sm.mvcc().revision(), 2);
    assert_eq!(
        all_keys(&m.sm),
        [KeyValue {
            key: b"a".to_vec().into(),
            create_revision: 1,
            mod_revision: 2,
            version: 2,
            value: b"2".to_vec().into(),
            lease: 0,
        }]
    );
}

/// A follower applies entries another member led only after the tasks that are ready to run
/// (among them the AppendEntries answer openraft hands over with those entries); a leader
/// applies its own entries at once, since its clients wait for them.
#[tokio::test(flavor = "current_thread")]
async fn a_follower_applies_after_the_ready_answers_and_a_leader_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().expect("tempdir");
    let Member {
        db: _db,
        log: _log,
        sm,
    } = Member::open(dir.path()).expect("open");
    let mut sm = sm.answering_first(1);
    // (the entry's leader, its index, whether a ready task runs before the apply returns)
    for (leader, index, ready_runs_first) in [(1, 1, false), (2, 2, true), (1, 3, false)] {
        let ran = Arc::new(AtomicBool::new(false));
        let answer = ran.clone();
        tokio::spawn(async move { answer.store(true, Ordering::SeqCst) });
        let put = put_cmd(&format!("k{index}"), "v", 0);
        let e = Entry {
            log_id: log_id(1, leader, index),
            payload: EntryPayload::Normal(put),
        };
        sm.apply([e]).await.expect("apply");
        assert_eq!(
            ran.load(Ordering::SeqCst),
            ready_runs_first,
            "entry {index} led by member {leader}, applied by member 1"
        );
        // The ready task runs now if it has not yet.
        tokio::task::yield_now().await;
        assert!(ran.load(Ordering::SeqCst));
    }
    assert_eq!(all_keys(&sm).len(), 3);
}

#[test]
fn log_store_keeps_entries_and_vote_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let mut m = Member::open(dir.path()).expect("open");
        // Entries 0..=10 and the vote (1, 0).
        TheSuite::feed_10_logs_vote_self(&mut m.log)
            .await
            .expect("append");
        m.log.purge(log_id(1, 0, 3)).await.expect("purge");
        m.log.truncate(log_id(1, 0, 9)).await.expect("truncate");
        m.log
            .save_committed(Some(log_id(1, 0, 7)))
            .await
            .expect("save committed");
        m.db.flush_async().await.expect("flush");
    });
    rt.block_on(async {
        let mut m = Member::open(dir.path()).expect("reopen");
        let state = m.log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 0, 3)));
        assert_eq!(state.last_log_id, Some(log_id(1, 0, 8)));
        let ids: Vec<LogId> = m
            .log
            .try_get_log_entries(0..)
            .await
            .expect("entries")
            .into_iter()
            .map(|e| e.log_id)
            .collect();
        assert_eq!(ids, (4..=8).map(|i| log_id(1, 0, i)).collect::<Vec<_>>());
        assert_eq!(
            m.log.read_vote().await.expect("vote"),
            Some(Vote::new(1, 0))
        );
        assert_eq!(
            m.log.read_committed().await.expect("committed"),
            Some(log_id(1, 0, 7))
        );
    });
}

#[tokio::test]
async fn a_snapshot_carries_the_mvcc_state_to_another_member() {
    let ((_leader_dir, mut leader), (_follower_dir, mut follower)) = leader_and_follower();
    leader
        .sm
        .apply([
            entry(1, 1, EntryPayload::Membership(membership(&[1, 2]))),
            entry(
                1,
                2,
                EntryPayload::Normal(Command::LeaseGrant { id: 7, ttl: 30 }),
            ),
            entry(1, 3, EntryPayload::Normal(put_cmd("a", "1", 7))),
            entry(1, 4, EntryPayload::Normal(put_cmd("b", "1", 0))),
            entry(1, 5, EntryPayload::Normal(Command::Compact { revision: 1 })),
        ])
        .await
        .expect("apply");
    // The follower has state of its own, which the snapshot replaces.
    follower
        .sm
        .apply([entry(1, 1, EntryPayload::Normal(put_cmd("stale", "x", 0)))])
        .await
        .expect("apply");

    let snapshot = build_snapshot(&mut leader).await;
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 0, 5)));
    // What openraft sends: the current snapshot, read from its file (it keeps only the
    // metadata of one it had built).
    let sent = current_snapshot(&mut leader).await;
    assert_eq!(sent.meta, snapshot.meta);
    let mut received = follower
        .sm
        .begin_receiving_snapshot()
        .await
        .expect("receive");
    *received = *sent.snapshot;
    follower
        .sm
        .install_snapshot(&sent.meta, received)
        .await
        .expect("install");

    assert_eq!(
        follower.sm.applied_state().await.expect("state"),
        leader.sm.applied_state().await.expect("state")
    );
    assert_eq!(all_keys(&follower.sm), all_keys(&leader.sm));
    let (f, l) = (follower.sm.mvcc(), leader.sm.mvcc());
    assert_eq!((f.revision(), f.compact_revision()), (2, 1));
    assert_eq!(f.hash_kv(0), l.hash_kv(0));
    assert_eq!(f.lease_keys(7).expect("lease keys"), [b"a".to_vec()]);
    // The next entry applies on the follower as on the leader.
    for m in [&mut leader, &mut follower] {
        let got =
            m.sm.apply([entry(
                1,
                6,
                EntryPayload::Normal(Command::LeaseRevoke { id: 7 }),
            )])
            .await
            .expect("apply");
        assert_eq!(got[0].revision, 3);
    }
    assert_eq!(all_keys(&follower.sm), all_keys(&leader.sm));
}

/// A snapshot received as a snapshot stream receives it, the snapshot file's head before the
/// data, becomes the follower's snapshot file as it is: moved into place, not copied.
#[tokio::test]
async fn a_snapshot_received_with_its_file_s_head_is_moved_into_place() {
    use std::os::unix::fs::MetadataExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ((_leader_dir, mut leader), (follower_dir, mut follower)) = leader_and_follower();
    for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
        leader
            .sm
            .apply([entry(
                1,
                i as u64 + 1,
                EntryPayload::Normal(put_cmd(k, k, 0)),
            )])
            .await
            .expect("apply");
    }
    build_snapshot(&mut leader).await;
    let sent = current_snapshot(&mut leader).await;
    let mut bytes = Vec::new();
    let mut data = sent.snapshot;
    data.read_to_end(&mut bytes).await.expect("read data");
    let mut received = follower
        .sm
        .begin_receiving_snapshot()
        .await
        .expect("receive");
    let head =
        super::state_machine::snapshot_file_head(&sent.meta, bytes.len() as u64).expect("head");
    received.write_head(&head).await.expect("head");
    received.write_all(&bytes).await.expect("data");
    let path = received.path().to_path_buf();
    let inode = std::fs::metadata(&path).expect("received").ino();
    follower
        .sm
        .install_snapshot(&sent.meta, received)
        .await
        .expect("install");
    let file = follower_dir.path().join("snapshot.bin");
    assert_eq!(
        std::fs::metadata(&file).expect("snapshot file").ino(),
        inode,
        "the received file was copied, not moved into place"
    );
    assert!(!path.exists(), "the received file is still there");
    assert_eq!(all_keys(&follower.sm), all_keys(&leader.sm));
    // The file reads back as the member's snapshot after a restart.
    drop(follower);
    let mut again = Member::open(follower_dir.path()).expect("reopen");
    let current = again
        .sm
        .get_current_snapshot()
        .await
        .expect("read")
        .expect("the snapshot is there");
    assert_eq!(current.meta, sent.meta);
}

#[tokio::test]
async fn a_damaged_snapshot_is_refused_before_it_changes_anything() {
    use tokio::io::AsyncWriteExt;
    let ((leader_dir, mut leader), (follower_dir, mut follower)) = leader_and_follower();
    for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
        let e = entry(1, i as u64 + 1, EntryPayload::Normal(put_cmd(k, "1", 0)));
        leader.sm.apply([e]).await.expect("apply");
    }
    follower
        .sm
        .apply([entry(1, 1, EntryPayload::Normal(put_cmd("mine", "x", 0)))])
        .await
        .expect("apply");
    let built = build_snapshot(&mut leader).await;
    // The data as received, its last byte lost.
    let file = std::fs::read(leader_dir.path().join("snapshot.bin")).expect("snapshot file");
    let data = &file[bincode::serialized_size(&built.meta).expect("size") as usize + 8..];
    let mut received = follower
        .sm
        .begin_receiving_snapshot()
        .await
        .expect("receive");
    received
        .write_all(&data[..data.len() - 1])
        .await
        .expect("write");
    received.shutdown().await.expect("shutdown");
    let err = follower
        .sm
        .install_snapshot(&built.meta, received)
        .await
        .expect_err("a damaged snapshot is refused");
    assert!(err.to_string().contains("cut short"), "{err}");
    assert_eq!(
        all_keys(&follower.sm)
            .iter()
            .map(|kv| kv.key.clone())
            .collect::<Vec<_>>(),
        [b"mine".to_vec()]
    );
    assert!(!follower_dir.path().join("snapshot.bin").exists());
    assert!(follower
        .sm
        .get_current_snapshot()
        .await
        .expect("read")
        .is_none());
}

#[tokio::test]
async fn an_interrupted_snapshot_install_finishes_at_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut m = Member::open(dir.path()).expect("open");
        m.sm.apply([entry(1, 1, EntryPayload::Normal(put_cmd("a", "1", 0)))])
            .await
            .expect("apply");
        // The snapshot file is written ...
        build_snapshot(&mut m).await;
        m.sm.apply([entry(1, 2, EntryPayload::Normal(put_cmd("b", "1", 0)))])
            .await
            .expect("apply");
        // ... and the member stops after marking the install, before the trees hold it.
        std::fs::write(dir.path().join("snapshot.installing"), b"").expect("marker");
        m.db.flush().expect("flush");
    }
    let mut m = Member::open(dir.path()).expect("reopen");
    assert_eq!(
        m.sm.applied_state().await.expect("state").0,
        Some(log_id(1, 0, 1)),
        "the state is the snapshot's"
    );
    assert_eq!(all_keys(&m.sm).len(), 1);
    assert!(
        !dir.path().join("snapshot.installing").exists(),
        "the marker is removed once the install is done"
    );
}

#[tokio::test]
async fn a_batch_applies_each_command_once_even_across_a_crash_in_its_middle() {
    let batch = || {
        Command::Batch(vec![
            put_cmd("a", "1", 0),
            put_cmd("b", "1", 0),
            put_cmd("a", "2", 0),
        ])
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Member::open(dir.path()).expect("open");
    let out =
        m.sm.apply([entry(1, 1, EntryPayload::Normal(batch()))])
            .await
            .expect("apply");
    let Ok(Output::Batch(results)) = &out[0].output else {
        panic!("a batch answers with one result per command: {out:?}");
    };
    let revisions: Vec<i64> = results.iter().map(|r| r.revision).collect();
    assert_eq!(revisions, [1, 2, 3], "one revision per command");
    assert!(results.iter().all(|r| r.output == put_ok()));
    assert_eq!(
        m.sm.applied_state().await.expect("state").0,
        Some(log_id(1, 0, 1))
    );

    // A member that stopped after the first command of the batch: the entry is applied again
    // at the next start, and only the commands after the first take effect.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut m = Member::open(dir.path()).expect("open");
    let progress = bincode::serialize(&(log_id::<u64>(1, 0, 1), 1usize)).expect("encode");
    m.sm.mvcc()
        .apply(
            &put_cmd("a", "1", 0),
            vec![(super::state_machine::META_BATCH_PROGRESS.to_vec(), progress)],
        )
        .expect("first command");
    assert_eq!(m.sm.applied_state().await.expect("state").0, None);
    let out =
        m.sm.apply([entry(1, 1, EntryPayload::Normal(batch()))])
            .await
            .expect("apply");
    let Ok(Output::Batch(results)) = &out[0].output else {
        panic!("{out:?}");
    };
    assert_eq!(results.len(), 2, "the applied command is not applied twice");
    let keys = all_keys(&m.sm);
    let a = keys.iter().find(|kv| kv.key == b"a"[..]).expect("a");
    assert_eq!((a.version, a.mod_revision), (2, 3));
    assert_eq!(
        m.sm.applied_state().await.expect("state").0,
        Some(log_id(1, 0, 1))
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for item in std::fs::read_dir(from).expect("read dir") {
        let item = item.expect("entry");
        let target = to.join(item.file_name());
        if item.file_type().expect("type").is_dir() {
            copy_dir(&item.path(), &target);
        } else {
            std::fs::copy(item.path(), &target).expect("copy");
        }
    }
}

/// sled is not synced when an entry is applied, so after a power cut the trees can be older
/// than the snapshot file, whose entries the log may have purged already. The member must start
/// from the snapshot then, not from its older trees with a log that no longer reaches back.
#[tokio::test]
async fn a_state_machine_behind_the_snapshot_on_disk_is_restored_from_it_at_open() {
    let behind = tempfile::tempdir().expect("tempdir");
    {
        let mut m = Member::open(behind.path()).expect("open");
        m.sm.apply([entry(1, 1, EntryPayload::Normal(put_cmd("a", "1", 0)))])
            .await
            .expect("apply");
        m.sm.mvcc().sync().expect("sync");
    }
    // The same member a little later: one more entry applied and a snapshot file covering it.
    let ahead = tempfile::tempdir().expect("tempdir");
    copy_dir(behind.path(), ahead.path());
    {
        let mut m = Member::open(ahead.path()).expect("open");
        m.sm.apply([entry(1, 2, EntryPayload::Normal(put_cmd("b", "1", 0)))])
            .await
            .expect("apply");
        build_snapshot(&mut m).await;
    }
    // The power cut: the trees lost the second entry, the synced snapshot file did not.
    std::fs::copy(
        ahead.path().join("snapshot.bin"),
        behind.path().join("snapshot.bin"),
    )
    .expect("copy snapshot");
    let mut m = Member::open(behind.path()).expect("reopen");
    assert_eq!(
        m.sm.applied_state().await.expect("state").0,
        Some(log_id(1, 0, 2)),
        "the state machine starts from the snapshot"
    );
    let keys: Vec<Vec<u8>> = all_keys(&m.sm)
        .into_iter()
        .map(|kv| kv.key.to_vec())
        .collect();
    assert_eq!(keys, [b"a".to_vec(), b"b".to_vec()]);
}
