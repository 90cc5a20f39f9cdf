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
