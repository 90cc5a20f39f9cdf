//! Watchers: history replay, live events, compaction, slow and tracked consumers, and large deletes.

use super::*;

#[tokio::test]
async fn watch_replays_history_then_follows_live_changes() {
    // Revisions 1-3 happen before the watcher starts (replayed from history), 4-5 after.
    let a1 = kv("a", "1", 1, 1, 1);
    let a2 = kv("a", "2", 1, 2, 2);
    let b3 = kv("b", "1", 3, 3, 1);
    let everything = vec![
        (1, vec![put_event("a", "1", 1, 1, 1)]),
        (2, vec![with_prev(put_event("a", "2", 1, 2, 2), a1)]),
        (
            3,
            vec![
                put_event("b", "1", 3, 3, 1),
                with_prev(delete_event("a", 3), a2),
            ],
        ),
        (
            4,
            vec![put_event("c", "1", 4, 4, 1), put_event("d", "1", 4, 4, 1)],
        ),
        (5, vec![with_prev(delete_event("b", 5), b3)]),
    ];
    let without_prev = |msgs: &[(i64, Vec<Event>)]| -> Messages {
        msgs.iter()
            .map(|(rev, events)| {
                let events = events
                    .iter()
                    .cloned()
                    .map(|mut e| {
                        e.prev_kv = None;
                        e
                    })
                    .collect();
                (*rev, events)
            })
            .collect()
    };
    let only = |msgs: Messages, keep: &dyn Fn(&Event) -> bool| {
        msgs.into_iter()
            .map(|(rev, events)| (rev, events.into_iter().filter(|e| keep(e)).collect()))
            .filter(|(_, events): &(i64, Vec<Event>)| !events.is_empty())
            .collect::<Vec<_>>()
    };
    let spec = |range: KeyRange| WatchSpec {
        range,
        start_revision: 1,
        ..Default::default()
    };
    let cases: Vec<(&str, WatchSpec, Messages)> = vec![
        ("every key", spec(all()), without_prev(&everything)),
        (
            "with prev_kv",
            WatchSpec {
                prev_kv: true,
                ..spec(all())
            },
            everything.clone(),
        ),
        (
            "no_put",
            WatchSpec {
                no_put: true,
                ..spec(all())
            },
            without_prev(&only(everything.clone(), &|e| e.kind == EventKind::Delete)),
        ),
        (
            "no_delete",
            WatchSpec {
                no_delete: true,
                prev_kv: true,
                ..spec(all())
            },
            only(everything.clone(), &|e| e.kind == EventKind::Put),
        ),
        (
            "one key",
            spec(KeyRange::single("b")),
            without_prev(&only(everything.clone(), &|e| e.kv.key == b("b"))),
        ),
        (
            "a range",
            spec(between("b", "d")),
            without_prev(&only(everything.clone(), &|e| {
                e.kv.key == b("b") || e.kv.key == b("c")
            })),
        ),
        (
            "from a later revision",
            WatchSpec {
                start_revision: 3,
                ..spec(all())
            },
            without_prev(&everything[2..]),
        ),
        (
            "from the next revision",
            WatchSpec {
                start_revision: 0,
                ..spec(all())
            },
            without_prev(&everything[3..]),
        ),
    ];
    for (name, spec, want) in cases {
        let s = new_store();
        put(&s, "a", "1");
        put(&s, "a", "2");
        apply(
            &s,
            Txn::new()
                .then(op_put("b", "1"))
                .then(op_del(KeyRange::single("a")))
                .cmd(),
        );
        let mut rx = watch::start(s.clone(), spec, 16);
        apply(
            &s,
            Txn::new()
                .then(op_put("c", "1"))
                .then(op_put("d", "1"))
                .cmd(),
        );
        del(&s, KeyRange::single("b"));
        let mut got = Vec::new();
        for _ in 0..want.len() {
            match next(&mut rx).await {
                WatchMessage::Events { revision, events } => got.push((revision, events)),
                other => panic!("{name}: unexpected {other:?}"),
            }
        }
        assert_eq!(got, want, "{name}");
        // Nothing else is queued: the next message is a later change that every case sees.
        put(&s, "b", "2"); // 6
        del(&s, KeyRange::single("b")); // 7
        match next(&mut rx).await {
            WatchMessage::Events { revision, .. } => {
                assert!(revision >= 6, "{name}: an extra message for {revision}")
            }
            other => panic!("{name}: unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn watch_from_a_compacted_revision_is_cancelled() {
    let cases: Vec<(&str, i64, Option<Vec<i64>>)> = vec![
        ("before the compacted revision", 1, None),
        ("just before the compacted revision", 2, None),
        ("at the compacted revision", 3, Some(vec![3, 4])),
        ("after the compacted revision", 4, Some(vec![4])),
    ];
    for (name, start_revision, want) in cases {
        let s = new_store();
        put(&s, "a", "1"); // 1
        put(&s, "a", "2"); // 2
        put(&s, "b", "1"); // 3
        put(&s, "a", "3"); // 4
        apply(&s, Command::Compact { revision: 3 });
        let mut rx = watch::start(
            s.clone(),
            WatchSpec {
                range: all(),
                start_revision,
                ..Default::default()
            },
            16,
        );
        match want {
            None => {
                assert_eq!(
                    next(&mut rx).await,
                    WatchMessage::Compacted {
                        compact_revision: 3
                    },
                    "{name}"
                );
                let closed = tokio::time::timeout(WAIT, rx.recv())
                    .await
                    .expect("the watcher stops");
                assert_eq!(closed, None, "{name}: a compacted watcher is cancelled");
            }
            Some(revisions) => {
                for want in revisions {
                    match next(&mut rx).await {
                        WatchMessage::Events { revision, .. } => {
                            assert_eq!(revision, want, "{name}")
                        }
                        other => panic!("{name}: unexpected {other:?}"),
                    }
                }
            }
        }
    }
}

#[tokio::test]
async fn a_slow_watcher_gets_every_revision_once_and_in_order() {
    // More revisions than the hub keeps (4096), three events each, so that the watcher lags
    // and catches up from history in steps that end between revisions.
    const WRITES: i64 = 5000;
    let write = |s: &MvccStore, i: i64| {
        apply(
            s,
            Txn::new()
                .then(op_put(&format!("x/{i}"), "1"))
                .then(op_put(&format!("y/{i}"), "1"))
                .then(op_put(&format!("z/{i}"), "1"))
                .cmd(),
        )
    };
    let s = new_store();
    let mut rx = watch::start(
        s.clone(),
        WatchSpec {
            range: all(),
            ..Default::default()
        },
        1,
    );
    // First in sync with the live events ...
    write(&s, 1);
    assert!(matches!(
        next(&mut rx).await,
        WatchMessage::Events { revision: 1, .. }
    ));
    // ... then left behind.
    for i in 2..=WRITES {
        assert_eq!(write(&s, i).revision, i);
    }
    for want in 2..=WRITES {
        match next(&mut rx).await {
            WatchMessage::Events { revision, events } => {
                assert_eq!(revision, want);
                assert_eq!(
                    keys(&events.iter().map(|e| e.kv.clone()).collect::<Vec<_>>()),
                    [
                        format!("x/{want}"),
                        format!("y/{want}"),
                        format!("z/{want}")
                    ],
                    "a revision's events come in one message"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Caught up: the next live write is the next message.
    write(&s, WRITES + 1);
    assert!(matches!(
        next(&mut rx).await,
        WatchMessage::Events { revision, .. } if revision == WRITES + 1
    ));
}

/// What a set of watchers sent, as (watch id, message) in order.
type SetMessages = tokio::sync::mpsc::Receiver<(i64, watch::SetMessage)>;

fn watcher_set(s: &Arc<MvccStore>) -> (watch::WatchSet, SetMessages) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let set = watch::WatchSet::start(s.clone(), tx, |id, m| Some((id, m)));
    (set, rx)
}

async fn next_of_set(rx: &mut SetMessages) -> (i64, watch::SetMessage) {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a message of the set within the timeout")
        .expect("the set is still running")
}

fn on(key: &str) -> Result<WatchSpec, String> {
    Ok(WatchSpec {
        range: KeyRange::single(key),
        ..Default::default()
    })
}

/// A set's answer to a progress request comes after every event up to its revision of every
/// watcher in the set, on the one ordered channel: what a stream-wide progress may promise.
#[tokio::test]
async fn a_sets_progress_answer_follows_every_event_up_to_its_revision() {
    use watch::SetMessage::*;
    let s = new_store();
    put(&s, "a", "1"); // 1
    let (set, mut rx) = watcher_set(&s);
    assert!(set.add(0, on("a")).await);
    assert!(set.add(0, on("b")).await);
    assert_eq!(next_of_set(&mut rx).await, (0, Created { revision: 1 }));
    assert_eq!(next_of_set(&mut rx).await, (1, Created { revision: 1 }));
    put(&s, "a", "2"); // 2
    put(&s, "b", "1"); // 3
    put(&s, "c", "1"); // 4, outside every range
    assert!(set.request_progress().await);
    let mut seen = Vec::new();
    loop {
        match next_of_set(&mut rx).await {
            (id, Watch(WatchMessage::Events { revision, .. })) => seen.push((id, revision)),
            (watch::SET_ID, InSync { revision }) => {
                assert_eq!(revision, 4, "the store's revision when asked");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec![(0, 2), (1, 3)], "both events before the answer");
}

/// Ids: the set picks the lowest free one from its counter on, refuses a running one, and a
/// cancelled watcher says so once and sends nothing after it.
#[tokio::test]
async fn a_set_picks_ids_refuses_duplicates_and_cancels() {
    use watch::SetMessage::*;
    let s = new_store();
    let (set, mut rx) = watcher_set(&s);
    assert!(set.add(7, on("a")).await);
    assert_eq!(next_of_set(&mut rx).await, (7, Created { revision: 0 }));
    assert!(set.add(7, on("b")).await);
    assert_eq!(
        next_of_set(&mut rx).await,
        (7, Refused(watch::Refusal::DuplicateId))
    );
    assert!(set.add(0, Err("no key".into())).await);
    assert_eq!(
        next_of_set(&mut rx).await,
        (0, Refused(watch::Refusal::Invalid("no key".into())))
    );
    assert!(set.add(0, on("b")).await);
    assert_eq!(next_of_set(&mut rx).await, (0, Created { revision: 0 }));
    assert!(set.cancel(7).await);
    assert_eq!(next_of_set(&mut rx).await, (7, Canceled { reason: None }));
    put(&s, "a", "1"); // 1: watcher 7 is gone
    put(&s, "b", "1"); // 2
    let (id, message) = next_of_set(&mut rx).await;
    assert!(
        id == 0 && matches!(message, Watch(WatchMessage::Events { revision: 2, .. })),
        "only watcher 0's event, got {id} {message:?}"
    );
    assert_eq!(s.watcher_count(), 1);
    drop(set);
    let deadline = tokio::time::Instant::now() + WAIT;
    while s.watcher_count() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the set ends with its handle"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A watcher that starts far in the past catches up from history in chunks while a live
/// watcher of the same set keeps getting new events.
#[tokio::test]
async fn a_watcher_catching_up_does_not_hold_up_the_live_ones_of_its_set() {
    use watch::SetMessage::*;
    let s = new_store();
    let history = 5_000;
    for i in 0..history {
        put(&s, "old", &format!("{i}"));
    }
    let (set, mut rx) = watcher_set(&s);
    assert!(set.add(1, on("new")).await);
    assert_eq!(next_of_set(&mut rx).await.1, Created { revision: history });
    assert!(
        set.add(
            2,
            Ok(WatchSpec {
                range: KeyRange::single("old"),
                start_revision: 1,
                ..Default::default()
            })
        )
        .await
    );
    put(&s, "new", "1");
    let mut old_before_new = 0;
    loop {
        match next_of_set(&mut rx).await {
            (2, Created { .. }) => {}
            (2, Watch(WatchMessage::Events { .. })) => old_before_new += 1,
            (1, Watch(WatchMessage::Events { revision, .. })) => {
                assert_eq!(revision, history + 1);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        old_before_new < history,
        "the live event waited for the whole catch-up ({old_before_new} old events first)"
    );
}

/// A DeleteRange of more keys than `DELETED_VERSIONS_IN_EVENTS` does not read every deleted
/// version into its events; a watcher that asked for them still gets each one (read from the
/// history), one that replays the revision from history too, keys on a lease leave it, and the
/// response carries the versions when the request asks for them.
#[tokio::test]
async fn a_large_delete_gives_watchers_the_deleted_versions_they_asked_for() {
    use super::store::DELETED_VERSIONS_IN_EVENTS;
    let keys = DELETED_VERSIONS_IN_EVENTS + 5;
    for prev_kv_in_response in [false, true] {
        let s = new_store();
        grant(&s, 3, 60);
        let mut want = BTreeMap::new();
        for i in 0..keys {
            let key = format!("big/{i:05}");
            let applied = if i % 100 == 7 {
                put_lease(&s, &key, &format!("v{i}"), 3)
            } else {
                put(&s, &key, &format!("v{i}"))
            };
            want.insert(key.clone(), get(&s, &key).expect("just put"));
            assert!(applied.output.is_ok());
        }
        let before = s.revision();
        let watch = |prev_kv, start_revision| {
            watch::start(
                s.clone(),
                WatchSpec {
                    range: from_key("big/"),
                    start_revision,
                    prev_kv,
                    ..Default::default()
                },
                16,
            )
        };
        let mut live = watch(true, 0);
        let mut without = watch(false, 0);
        let mut hub = s.subscribe();
        // One key of the range is written by the deleting transaction itself.
        let applied = apply(
            &s,
            Txn::new()
                .then(op_put("big/00000", "in the same txn"))
                .then(Op::Delete(DeleteRequest {
                    range: from_key("big/"),
                    prev_kv: prev_kv_in_response,
                }))
                .cmd(),
        );
        let deleted = match &txn_result(&applied).responses[1] {
            OpResult::Delete(d) => d.clone(),
            other => panic!("not a delete: {other:?}"),
        };
        assert_eq!(deleted.deleted, keys as i64);
        assert_eq!(
            deleted.prev_kvs.len(),
            if prev_kv_in_response { keys } else { 0 }
        );
        let broadcast = hub.recv().await.expect("the delete's batch");
        let carried = broadcast
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Delete && e.prev_kv.is_some())
            .count();
        // The key the transaction wrote is in memory anyway.
        assert_eq!(carried, if prev_kv_in_response { keys } else { 1 });
        assert!(s.lease_keys(3).expect("lease keys").is_empty());

        let mut replay = watch(true, before + 1);
        want.insert(
            "big/00000".into(),
            kv(
                "big/00000",
                "in the same txn",
                want["big/00000"].create_revision,
                before + 1,
                2,
            ),
        );
        for (name, rx) in [("live", &mut live), ("replayed", &mut replay)] {
            let WatchMessage::Events { events, .. } = next(rx).await else {
                panic!("{name}: no events")
            };
            let deletes: BTreeMap<String, KeyValue> = events
                .into_iter()
                .filter(|e| e.kind == EventKind::Delete)
                .map(|e| {
                    let prev = e.prev_kv.unwrap_or_else(|| panic!("{name}: no prev_kv"));
                    (String::from_utf8(e.kv.key.to_vec()).expect("utf-8"), prev)
                })
                .collect();
            assert_eq!(deletes, want, "{name}");
        }
        let WatchMessage::Events { events, .. } = next(&mut without).await else {
            panic!("no events")
        };
        assert!(events.iter().all(|e| e.prev_kv.is_none()));
    }
}

/// A sharing set hands a watcher that wants a live revision whole the hub's batch itself (the
/// same `Arc` for every such watcher), with or without previous versions as it asked; a watcher
/// that wants part of a revision gets a copy of its events.
#[tokio::test]
async fn a_sharing_set_hands_whole_revisions_as_the_hubs_batch() {
    use watch::SetMessage::*;
    let s = new_store();
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let set = watch::WatchSet::start_sharing(s.clone(), tx, |id, m| Some((id, m)));
    let prefix = WatchSpec {
        range: KeyRange::prefix("k"),
        ..Default::default()
    };
    let one_with_prev = WatchSpec {
        range: KeyRange::single("k1"),
        prev_kv: true,
        ..Default::default()
    };
    assert!(set.add(0, Ok(prefix.clone())).await);
    assert!(set.add(0, Ok(prefix)).await);
    assert!(set.add(0, Ok(one_with_prev)).await);
    for id in 0..3 {
        assert_eq!(next_of_set(&mut rx).await, (id, Created { revision: 0 }));
    }
    apply(
        &s,
        Txn::new()
            .then(op_put("k1", "1"))
            .then(op_put("k2", "1"))
            .cmd(),
    ); // 1
    let (a, b) = match (next_of_set(&mut rx).await, next_of_set(&mut rx).await) {
        (
            (
                0,
                Shared {
                    batch: a,
                    prev_kv: false,
                },
            ),
            (
                1,
                Shared {
                    batch: b,
                    prev_kv: false,
                },
            ),
        ) => (a, b),
        other => panic!("both prefix watchers share revision 1: {other:?}"),
    };
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!((a.revision, a.events.len()), (1, 2));
    assert_eq!(
        next_of_set(&mut rx).await,
        (
            2,
            Watch(WatchMessage::Events {
                revision: 1,
                events: vec![put_event("k1", "1", 1, 1, 1)]
            })
        ),
        "k2 is not the third watcher's: it gets a copy of k1's event"
    );
    put(&s, "k1", "2"); // 2
    for id in 0..2 {
        assert!(
            matches!(next_of_set(&mut rx).await, (i, Shared { prev_kv: false, .. }) if i == id)
        );
    }
    match next_of_set(&mut rx).await {
        (
            2,
            Shared {
                batch,
                prev_kv: true,
            },
        ) => {
            assert_eq!(batch.events[0].prev_kv, Some(kv("k1", "1", 1, 1, 1)));
        }
        other => panic!("the third watcher wants revision 2 whole, with k1's prev: {other:?}"),
    }
}
