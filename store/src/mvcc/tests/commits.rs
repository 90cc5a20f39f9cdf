//! Staged changes and their commits: staging equals applying one by one, and crashes in the middle of a commit.

use super::*;

/// Commands staged into one [`Changes`] (committed only where a command needs changes of its
/// own) give the same results, the same trees byte for byte and the same watch events as the
/// same commands applied one by one: later commands see earlier ones' keys, compares see the
/// state before their own transaction, a refused command leaves nothing behind, and lease
/// attachments made and undone inside one set do not survive.
#[test]
fn staged_commands_end_as_the_same_commands_applied_one_by_one() {
    let cmds = vec![
        cmd_put("a", "1"),
        cmd_put("b", "1"),
        // Sees the staged "a".
        Txn::new()
            .when(cmp("a", CompareResult::Equal, CompareTarget::Value(b("1"))))
            .then(op_put("c", "a was 1"))
            .otherwise(op_put("c", "a was not 1"))
            .cmd(),
        Command::LeaseGrant { id: 7, ttl: 60 },
        put_cmd_lease("l", "1", 7),
        // Detaches "l" from lease 7 in the same set that attached it.
        cmd_put("l", "2"),
        put_cmd_lease("m", "1", 7),
        // Refused: no such lease; nothing of it remains.
        Txn::new()
            .then(op_put("refused", "x"))
            .then(op_put_lease("n", "1", 99))
            .cmd(),
        // A nested compare sees the state before the transaction, not its own put.
        Txn::new()
            .then(op_put("d", "1"))
            .then(
                Txn::new()
                    .when(cmp("d", CompareResult::Equal, CompareTarget::Version(0)))
                    .then(op_put("e", "d was absent before"))
                    .op(),
            )
            .then(op_get("d"))
            .then(op_range(all()))
            .cmd(),
        Txn::new()
            .then(op_del(between("a", "c")))
            .then(op_range(all()))
            .cmd(),
        // A read at a past revision reads only what sled holds: committed first.
        Txn::new()
            .then(Op::Range(RangeRequest {
                revision: 2,
                ..req(KeyRange::single("b"))
            }))
            .cmd(),
        cmd_put("a", "2"),
        Command::Compact { revision: 3 },
        cmd_put("f", "1"),
        Command::LeaseRevoke { id: 7 },
        cmd_put("g", "1"),
        Txn::new().then(op_del(all())).cmd(),
    ];

    let one_by_one = new_store();
    let mut watch_one = one_by_one.subscribe();
    let singly: Vec<Applied> = cmds.iter().map(|c| apply(&one_by_one, c.clone())).collect();

    let staged = new_store();
    let mut watch_staged = staged.subscribe();
    let mut changes = staged.changes();
    let mut commits = 0;
    let mut together = Vec::new();
    for c in &cmds {
        let applied = match staged.stage(&mut changes, c).expect("storage") {
            Some(a) => a,
            None => {
                staged
                    .commit(std::mem::replace(&mut changes, staged.changes()))
                    .expect("commit");
                commits += 1;
                changes = staged.changes();
                staged
                    .stage(&mut changes, c)
                    .expect("storage")
                    .expect("empty changes take it")
            }
        };
        together.push(applied);
    }
    staged.commit(changes).expect("commit");
    commits += 1;

    assert_eq!(together, singly, "the same results");
    // [a b txn] [grant] [l l m refused nested del] [past read] [a] [compact] [f] [revoke]
    // [g del]: the six commands that read sled's state or act after the commit stand alone.
    assert_eq!(commits, 9, "commits for {} commands", cmds.len());
    assert_eq!(
        staged.dump().expect("dump").contents(),
        one_by_one.dump().expect("dump").contents(),
        "the same trees"
    );
    // One store holds the history in runs of records, the other record by record.
    assert_eq!(
        staged.hash_kv(0).expect("hash"),
        one_by_one.hash_kv(0).expect("hash"),
        "the same HashKV"
    );
    let events = |rx: &mut tokio::sync::broadcast::Receiver<Arc<RevisionBatch>>| {
        let mut out = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            out.push((batch.revision, batch.events.clone()));
        }
        out
    };
    assert_eq!(
        events(&mut watch_staged),
        events(&mut watch_one),
        "the same events"
    );
}

/// A DeleteRange over many keys, some of them changed by commands staged before it in the
/// same commit (a new version, a new key, a deletion): it deletes each live key once, with
/// its last version (staged or committed), in key order. Each gets one Delete event whose
/// previous version is the one the response returns; history replays the same events; and
/// the trees, results and events are those of the commands applied one by one.
#[test]
fn a_delete_range_deletes_each_live_key_once_with_its_last_version() {
    const KEYS: usize = 3000;
    let name = |i: usize| format!("k{i:05}");
    let base = || -> Vec<Command> {
        let mut cmds = vec![Command::LeaseGrant { id: 9, ttl: 60 }];
        for i in 0..KEYS {
            // Every other key is put twice (version 2), every seventh holds the lease.
            cmds.push(if i % 7 == 0 {
                put_cmd_lease(&name(i), &format!("v{i}"), 9)
            } else {
                cmd_put(&name(i), &format!("v{i}"))
            });
            if i % 2 == 0 {
                cmds.push(cmd_put(&name(i), &format!("w{i}")));
            }
        }
        cmds
    };
    let staged_before = [
        cmd_put(&name(500), "staged"),
        cmd_put("k99999", "a key only staged"),
        cmd_put("l", "outside the range"),
        Txn::new().then(op_del(KeyRange::single(name(7)))).cmd(),
    ];
    let delete = Txn::new()
        .then(Op::Delete(DeleteRequest {
            range: between("k", "l"),
            prev_kv: true,
        }))
        .cmd();

    let one_by_one = new_store();
    let staged = new_store();
    for c in base() {
        apply(&one_by_one, c.clone());
        apply(&staged, c);
    }
    let before = one_by_one.revision();
    let mut watch_one = one_by_one.subscribe();
    let mut watch_staged = staged.subscribe();
    let mut singly: Vec<Applied> = staged_before
        .iter()
        .map(|c| apply(&one_by_one, c.clone()))
        .collect();
    singly.push(apply(&one_by_one, delete.clone()));
    let mut changes = staged.changes();
    let mut together = Vec::new();
    for c in staged_before.iter().chain([&delete]) {
        together.push(
            staged
                .stage(&mut changes, c)
                .expect("storage")
                .expect("staged into one commit"),
        );
    }
    staged.commit(changes).expect("commit");
    assert_eq!(together, singly, "the same results");

    let revision = before + staged_before.len() as i64 + 1;
    let result = match &txn_result(&together[staged_before.len()]).responses[0] {
        OpResult::Delete(d) => d.clone(),
        other => panic!("a delete response, got {other:?}"),
    };
    let mut want: Vec<String> = (0..KEYS).filter(|&i| i != 7).map(name).collect();
    want.push("k99999".into());
    assert_eq!(result.deleted, want.len() as i64);
    assert_eq!(
        keys(&result.prev_kvs),
        want,
        "each live key once, in key order"
    );
    for prev in &result.prev_kvs {
        let i: Option<usize> = String::from_utf8_lossy(&prev.key[1..]).parse().ok();
        let value = match i {
            Some(500) => "staged".to_string(),
            Some(i) if i < KEYS && i % 2 == 0 => format!("w{i}"),
            Some(i) if i < KEYS => format!("v{i}"),
            _ => "a key only staged".to_string(),
        };
        assert_eq!(prev.value, b(&value), "the last version of {:?}", prev.key);
        let leased = i.is_some_and(|i| i < KEYS && i % 7 == 0 && i % 2 == 1);
        assert_eq!(prev.lease, if leased { 9 } else { 0 });
    }
    assert!(staged.lease_keys(9).expect("lease keys").is_empty());

    let events = |rx: &mut tokio::sync::broadcast::Receiver<Arc<RevisionBatch>>| {
        let mut out = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            out.push((batch.revision, batch.events.clone()));
        }
        out
    };
    let live = events(&mut watch_staged);
    assert_eq!(live, events(&mut watch_one), "the same events");
    let (last, deletes) = live.last().expect("the delete's revision");
    assert_eq!(*last, revision);
    let expected: Vec<Event> = result
        .prev_kvs
        .iter()
        .map(|prev| {
            let key = String::from_utf8_lossy(&prev.key).into_owned();
            with_prev(delete_event(&key, revision), prev.clone())
        })
        .collect();
    assert!(
        *deletes == expected,
        "one Delete event per key with its previous version"
    );
    let replayed = staged
        .history(&between("k", "l"), revision, revision, true, usize::MAX)
        .expect("history");
    assert_eq!(replayed.len(), 1);
    assert!(
        replayed[0].events == expected,
        "history replays the same events"
    );
    assert_eq!(
        staged.dump().expect("dump").contents(),
        one_by_one.dump().expect("dump").contents(),
        "the same trees"
    );
    // One store holds the history in runs of records, the other record by record.
    assert_eq!(
        staged.hash_kv(0).expect("hash"),
        one_by_one.hash_kv(0).expect("hash"),
        "the same HashKV"
    );
    assert_eq!(
        range(&staged, req(all())).expect("range").kvs,
        vec![kv("l", "outside the range", before + 3, before + 3, 1)]
    );
}

/// A commit is many sled writes; sled recovers a prefix of them after a crash. Whatever prefix
/// survived, the store opens with the whole commit (once all its history records were
/// written) or none of it (the Raft log applies it again), never half of it.
#[test]
fn a_commit_cut_after_any_of_its_writes_is_whole_or_absent_after_reopening() {
    let base = || {
        vec![
            cmd_put("a", "1"),
            cmd_put("b", "1"),
            Command::LeaseGrant { id: 5, ttl: 60 },
            put_cmd_lease("c", "1", 5),
        ]
    };
    // Values large enough that the commit's history records fill more than one run.
    let big = "x".repeat(2_500);
    let next = vec![
        cmd_put("a", &big),
        put_cmd_lease("b", &big, 5),
        cmd_put("c", "2"),
        Txn::new().then(op_del(KeyRange::single("a"))).cmd(),
        cmd_put("d", &big),
    ];
    let open = |dir: &std::path::Path| {
        let db = crate::reopen_sled(dir).expect("sled opens");
        let store = MvccStore::open(&db).expect("mvcc store opens");
        (db, store)
    };
    let stage = |store: &MvccStore| {
        let mut changes = store.changes();
        for c in &next {
            store
                .stage(&mut changes, c)
                .expect("storage")
                .expect("staged together");
        }
        changes
    };
    let dump = |store: &MvccStore| store.dump().expect("dump").contents();

    let whole_dir = tempfile::tempdir().expect("tempdir");
    let (_db, whole) = open(whole_dir.path());
    for c in base() {
        apply(&whole, c);
    }
    let before = (dump(&whole), whole.revision());
    let (writes, history) = stage(&whole).into_commit().write_count();
    assert!(history >= 2, "{history} history values");
    whole.commit(stage(&whole)).expect("commit");
    let after = (dump(&whole), whole.revision());

    for kept in 0..=writes {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let (db, store) = open(dir.path());
            for c in base() {
                apply(&store, c);
            }
            store.commit_torn(stage(&store), kept).expect("torn commit");
            db.flush().expect("flush");
        }
        let (_db, store) = open(dir.path());
        let got = (dump(&store), store.revision());
        let want = if kept >= history { &after } else { &before };
        assert!(
            got == *want,
            "after {kept} of {writes} writes ({history} history values) the store holds {} \
             (revision {})",
            if got == before {
                "the state before the commit"
            } else if got == after {
                "the whole commit"
            } else {
                "half a commit"
            },
            got.1
        );
    }
}

/// A crash while a commit writes its redo over the last one's: the store opens with the last
/// whole commit (it used to refuse to open: "the last commit's redo does not match its
/// checksum").
#[test]
fn a_commit_cut_while_its_redo_is_written_leaves_the_commit_before_it() {
    let open = |dir: &std::path::Path| {
        let db = crate::reopen_sled(dir).expect("sled opens");
        let store = MvccStore::open(&db).expect("mvcc store opens");
        (db, store)
    };
    let dump = |store: &MvccStore| store.dump().expect("dump").contents();
    let dir = tempfile::tempdir().expect("tempdir");
    let before = {
        let (db, store) = open(dir.path());
        apply(&store, cmd_put("a", "1"));
        apply(&store, Command::LeaseGrant { id: 5, ttl: 60 });
        apply(&store, put_cmd_lease("b", "1", 5));
        let before = (dump(&store), store.revision());
        let mut changes = store.changes();
        store
            .stage(&mut changes, &cmd_put("a", &"x".repeat(300_000)))
            .expect("storage")
            .expect("staged");
        store.redo_torn(changes, 1).expect("torn redo");
        db.flush().expect("flush");
        before
    };
    let (_db, store) = open(dir.path());
    assert!(
        (dump(&store), store.revision()) == before,
        "the store does not hold the last whole commit"
    );
    apply(&store, cmd_put("c", "1"));
}

/// The key index lives in memory and is built from the history when the store opens: every
/// read, at the newest revision and at each past one since the compaction, answers the same
/// after a reopen. A store of a build that kept the index in sled trees has them dropped.
#[test]
fn a_reopened_store_reads_every_revision_as_before() {
    let dir = tempfile::tempdir().expect("tempdir");
    let read_all = |store: &MvccStore| {
        let newest = store.revision();
        (store.compact_revision()..=newest)
            .map(|at| {
                let mut r = req(all());
                r.revision = if at == newest { 0 } else { at.max(1) };
                range(store, r).map(|res| res.kvs)
            })
            .collect::<Vec<_>>()
    };
    let before = {
        let db = crate::reopen_sled(dir.path()).expect("sled opens");
        // What an older build left behind.
        db.open_tree("mvcc_cur")
            .expect("tree")
            .insert(b"stale", b"x".as_slice())
            .expect("insert");
        db.open_tree("mvcc_kidx").expect("tree");
        let store = MvccStore::open(&db).expect("mvcc store opens");
        let names = db.tree_names();
        assert!(
            !names
                .iter()
                .any(|n| n.as_ref() == b"mvcc_cur" || n.as_ref() == b"mvcc_kidx"),
            "the trees of the old key index are still there"
        );
        grant(&store, 9, 60);
        for i in 0..20 {
            put(&store, &format!("k{}", i % 7), &format!("v{i}"));
            if i % 5 == 4 {
                del(&store, between("k2", "k4"));
            }
        }
        put_lease(&store, "leased", "x", 9);
        apply(&store, Command::Compact { revision: 12 });
        put(&store, "k\0nul", "after the compaction");
        del(&store, KeyRange::single("k5"));
        let before = (read_all(&store), store.revision(), store.hash_kv(0));
        assert!(get(&store, "k5").is_none() && get(&store, "k6").is_some());
        db.flush().expect("flush");
        before
    };
    let db = crate::reopen_sled(dir.path()).expect("sled opens");
    let store = MvccStore::open(&db).expect("mvcc store opens");
    assert!(before.0.iter().all(|r| r.is_ok()));
    assert_eq!(
        (read_all(&store), store.revision(), store.hash_kv(0)),
        before
    );
    assert_eq!(store.lease_keys(9).expect("lease keys"), vec![b("leased")]);
    // The reopened store goes on from where it was.
    let next = put(&store, "k0", "next").revision;
    assert_eq!(next, before.1 + 1);
    assert_eq!(get(&store, "k0").map(|kv| kv.version), Some(4));
}

/// A key is held once: a put's event, the key index and a later DeleteRange's events share
/// one buffer, so deleting a hundred thousand keys does not copy every key twice more (the
/// staged deletion and its event each held a copy before, a third of a member's peak memory in
/// `etcdctl check perf`'s final delete).
#[tokio::test]
async fn a_large_deletes_events_share_the_keys_buffers_with_the_puts() {
    use super::store::DELETED_VERSIONS_IN_EVENTS;
    let s = new_store();
    let mut hub = s.subscribe();
    let keys = DELETED_VERSIONS_IN_EVENTS + 5;
    let mut put_keys = BTreeMap::new();
    for i in 0..keys {
        put(&s, &format!("k/{i:05}"), "v");
        let batch = hub.recv().await.expect("the put's batch");
        let key = batch.events[0].kv.key.clone();
        put_keys.insert(key.to_vec(), key.as_ptr());
    }
    // Staged after a put of one of the keys, as a batched entry would stage them.
    let mut changes = s.changes();
    for cmd in [
        cmd_put("k/00000", "again"),
        Txn::new().then(op_del(from_key("k/"))).cmd(),
    ] {
        s.stage(&mut changes, &cmd)
            .expect("storage")
            .expect("staged");
    }
    s.commit(changes).expect("commit");
    let _put_again = hub.recv().await.expect("the second put's batch");
    let deleted = hub.recv().await.expect("the delete's batch");
    assert_eq!(deleted.events.len(), keys);
    for event in &deleted.events[1..] {
        assert_eq!(
            Some(&event.kv.key.as_ptr()),
            put_keys.get(&event.kv.key[..]),
            "the delete event of {:?} has a copy of the key",
            String::from_utf8_lossy(&event.kv.key)
        );
    }
}
