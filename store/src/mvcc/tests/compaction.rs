//! Compaction, and the hash of the history after it.

use super::*;

#[test]
fn compaction_drops_old_revisions_and_keeps_the_compacted_one() {
    let s = new_store();
    put(&s, "a", "1"); // 1
    put(&s, "a", "2"); // 2
    put(&s, "b", "1"); // 3
    del(&s, KeyRange::single("b")); // 4
    put(&s, "c", "1"); // 5
    put(&s, "a", "3"); // 6
    let compacted = apply(&s, Command::Compact { revision: 5 });
    assert_eq!(compacted.output, Ok(Output::Compacted));
    assert_eq!(compacted.revision, 6, "a compaction is not a revision");
    assert_eq!(s.compact_revision(), 5);

    let at = |range: KeyRange, revision| RangeRequest {
        revision,
        ..req(range)
    };
    let gone = Err(MvccError::Compacted {
        compact_revision: 5,
    });
    let reads: Vec<(&str, RangeRequest, Read)> = vec![
        ("revision 1", at(KeyRange::single("a"), 1), gone.clone()),
        ("revision 4", at(all(), 4), gone.clone()),
        (
            "the compacted revision keeps each key's version",
            at(all(), 5),
            Ok(vec![kv("a", "2", 1, 2, 2), kv("c", "1", 5, 5, 1)]),
        ),
        (
            "a key deleted before the compacted revision stays deleted",
            at(KeyRange::single("b"), 5),
            Ok(vec![]),
        ),
        (
            "after the compacted revision",
            at(all(), 6),
            Ok(vec![kv("a", "3", 1, 6, 3), kv("c", "1", 5, 5, 1)]),
        ),
        (
            "the newest",
            at(all(), 0),
            Ok(vec![kv("a", "3", 1, 6, 3), kv("c", "1", 5, 5, 1)]),
        ),
        ("the future", at(all(), 7), Err(MvccError::FutureRevision)),
    ];
    for (name, r, want) in reads {
        assert_eq!(range(&s, r).map(|r| r.kvs), want, "{name}");
    }

    let compactions: Vec<(&str, i64, Result<Output, MvccError>)> = vec![
        (
            "the same revision again",
            5,
            Err(MvccError::Compacted {
                compact_revision: 5,
            }),
        ),
        (
            "an older revision",
            3,
            Err(MvccError::Compacted {
                compact_revision: 5,
            }),
        ),
        ("the future", 7, Err(MvccError::FutureRevision)),
        ("the newest revision", 6, Ok(Output::Compacted)),
    ];
    for (name, revision, want) in compactions {
        let applied = apply(&s, Command::Compact { revision });
        assert_eq!(applied.output, want, "{name}");
        assert_eq!(applied.revision, 6, "{name}");
    }
    assert_eq!(s.compact_revision(), 6);
    assert_eq!(
        range(&s, at(all(), 5)).map(|r| r.kvs),
        Err(MvccError::Compacted {
            compact_revision: 6
        })
    );
}

#[test]
fn a_compaction_cut_short_by_a_crash_is_finished_at_the_next_open() {
    let write = |s: &MvccStore| {
        put(s, "a", "1"); // 1
        put(s, "a", "2"); // 2
        put(s, "b", "1"); // 3
        put(s, "a", "3"); // 4
    };
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("temporary sled db opens");
    let crashed = MvccStore::open(&db).expect("open");
    write(&crashed);
    // What `apply(Compact { revision: 3 })` commits, together with the Raft applied id, before
    // it compacts; the member stops right there, so the log never applies it again.
    db.open_tree("mvcc_meta")
        .expect("meta tree")
        .insert("compact_scheduled", &3i64.to_be_bytes())
        .expect("insert");
    drop(crashed);
    let reopened = MvccStore::open(&db).expect("reopen");

    let completed = new_store();
    write(&completed);
    apply(&completed, Command::Compact { revision: 3 });
    for s in [&reopened, &completed] {
        assert_eq!(s.compact_revision(), 3);
        assert_eq!(
            get_at(s, "a", 2),
            Err(MvccError::Compacted {
                compact_revision: 3
            })
        );
        assert_eq!(get_at(s, "a", 3), Ok(Some(kv("a", "2", 1, 2, 2))));
    }
    assert_eq!(reopened.hash_kv(0), completed.hash_kv(0));
}

#[test]
fn hash_kv_after_compaction_is_the_same_on_every_store_that_applied_the_same_commands() {
    let script = |last: &str| {
        vec![
            cmd_put("a", "1"),
            cmd_put("b", "1"),
            cmd_put("a", "2"),
            Txn::new().then(op_del(KeyRange::single("b"))).cmd(),
            Command::Compact { revision: 3 },
            cmd_put("c", "1"),
            cmd_put("a", last),
        ]
    };
    let replay = |cmds: Vec<Command>| {
        let s = new_store();
        for cmd in cmds {
            let applied = apply(&s, cmd);
            assert!(applied.output.is_ok(), "{:?}", applied.output);
        }
        s
    };
    let one = replay(script("3"));
    let two = replay(script("3"));
    let other = replay(script("different"));
    for revision in [0, 3, 4, 6] {
        let hash = one.hash_kv(revision).expect("hash");
        assert_eq!(hash.1, 3, "the compact revision comes with the hash");
        assert_eq!(hash, two.hash_kv(revision).expect("hash"), "at {revision}");
    }
    assert_ne!(
        one.hash_kv(0).expect("hash"),
        other.hash_kv(0).expect("hash"),
        "a different history hashes differently"
    );
    assert_eq!(
        one.hash_kv(4).expect("hash"),
        other.hash_kv(4).expect("hash"),
        "the same history up to a revision hashes the same"
    );
    assert_eq!(
        one.hash_kv(2),
        Err(MvccError::Compacted {
            compact_revision: 3
        })
    );
    assert_eq!(one.hash_kv(7), Err(MvccError::FutureRevision));
}

/// A commit of many records stores them in runs (see `history_runs`), and a compaction can
/// drop part of a run. A store that committed the same commands one by one holds each record
/// alone: both read, replay, hash and reopen alike.
#[test]
fn a_compaction_inside_runs_of_records_leaves_reads_history_and_hashes_as_record_by_record() {
    let value = |i: usize| format!("{i:0>120}");
    let mut cmds: Vec<Command> = (0..300)
        .map(|i| cmd_put(&format!("k{i:03}"), &value(i)))
        .collect();
    // Revision 301: a DeleteRange of 150 keys, one revision of 150 records.
    cmds.push(Txn::new().then(op_del(between("k100", "k250"))).cmd());
    cmds.extend((0..50).map(|i| cmd_put(&format!("k{:03}", i * 3), "again")));
    let last = cmds.len() as i64;

    let dir = tempfile::tempdir().expect("tempdir");
    let db = crate::reopen_sled(dir.path()).expect("sled opens");
    let batched = MvccStore::open(&db).expect("store");
    // Committed in batches of 64 commands: runs that span revisions.
    for chunk in cmds.chunks(64) {
        let mut changes = batched.changes();
        for c in chunk {
            batched
                .stage(&mut changes, c)
                .expect("storage")
                .expect("staged together");
        }
        batched.commit(changes).expect("commit");
    }
    let single = new_store();
    for c in &cmds {
        apply(&single, c.clone());
    }
    let runs = db.open_tree("mvcc_hist").expect("tree").len();
    assert!(
        runs * 3 < last as usize,
        "{runs} history values for {last} revisions"
    );

    let deletes = batched
        .history(&all(), 301, 301, false, usize::MAX)
        .expect("history");
    assert_eq!(deletes[0].events.len(), 150);
    assert_eq!(
        deletes,
        single
            .history(&all(), 301, 301, false, usize::MAX)
            .expect("history")
    );
    // Drops the DeleteRange's runs, the deleted keys' versions from the runs of the puts, and
    // the versions that the later puts replaced, keeping the rest of those runs.
    for s in [&batched, &single] {
        apply(s, Command::Compact { revision: 320 });
    }
    assert!(db.open_tree("mvcc_hist").expect("tree").len() < runs);
    let check = |a: &MvccStore, b: &MvccStore| {
        assert_eq!(
            a.dump().expect("dump").contents(),
            b.dump().expect("dump").contents()
        );
        for at in [0, 320, 330, last] {
            assert_eq!(a.hash_kv(at), b.hash_kv(at), "HashKV at {at}");
        }
        for at in [320, 321, 340, last] {
            let r = |s: &MvccStore| {
                range(
                    s,
                    RangeRequest {
                        revision: at,
                        ..req(all())
                    },
                )
                .expect("range")
                .kvs
            };
            assert_eq!(r(a), r(b), "range at {at}");
        }
        for from in [320, 321, 340] {
            let h = |s: &MvccStore| {
                s.history(&all(), from, last, true, usize::MAX)
                    .expect("history")
            };
            assert_eq!(h(a), h(b), "history from {from}");
        }
        // 150 keys outside the DeleteRange, and 16 put again after it.
        assert_eq!(range(a, req(all())).expect("range").kvs.len(), 166);
    };
    check(&batched, &single);
    assert_eq!(
        get(&batched, "k299"),
        Some(kv("k299", &value(299), 300, 300, 1))
    );
    // The key index is rebuilt from the runs left after the compaction.
    drop(batched);
    drop(db);
    let db = crate::reopen_sled(dir.path()).expect("sled reopens");
    let reopened = MvccStore::open(&db).expect("store reopens");
    check(&reopened, &single);
}
