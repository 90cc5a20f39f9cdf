//! Dump and restore.

use super::*;

#[test]
fn dump_and_restore_give_the_same_state() {
    let source = new_store();
    put(&source, "a", "1"); // 1
    put(&source, "b", "1"); // 2
    put(&source, "a", "2"); // 3
    grant(&source, 5, 30);
    put_lease(&source, "l", "x", 5); // 4
    del(&source, KeyRange::single("b")); // 5
    apply(&source, Command::Compact { revision: 3 });
    put(&source, "c", "1"); // 6

    // The target has state of its own, which the restore replaces.
    let target = new_store();
    for i in 0..10 {
        put(&target, &format!("junk/{i}"), "x");
    }
    grant(&target, 9, 30);
    target
        .restore(source.dump().expect("dump"))
        .expect("restore");

    let at = |revision| RangeRequest {
        revision,
        ..req(all())
    };
    let reads = vec![
        ("the newest", at(0)),
        ("the compacted revision", at(3)),
        ("between", at(4)),
        ("compacted away", at(2)),
        ("the future", at(7)),
        (
            "a single key in the past",
            RangeRequest {
                revision: 4,
                ..req(KeyRange::single("b"))
            },
        ),
        (
            "sorted and limited",
            RangeRequest {
                sort_order: SortOrder::Descend,
                sort_target: SortTarget::Mod,
                limit: 2,
                ..req(all())
            },
        ),
    ];
    for (name, r) in reads {
        assert_eq!(range(&target, r.clone()), range(&source, r), "{name}");
    }
    assert_eq!(target.revision(), 6);
    assert_eq!(target.compact_revision(), 3);
    assert_eq!(target.hash_kv(0), source.hash_kv(0));
    assert_eq!(
        target.leases().expect("leases"),
        source.leases().expect("leases")
    );
    assert_eq!(target.lease_keys(5).expect("keys"), [b("l")]);
    // Both go on the same way.
    for s in [&source, &target] {
        assert_eq!(put(s, "d", "1").revision, 7);
        assert_eq!(apply(s, Command::LeaseRevoke { id: 5 }).revision, 8);
    }
    assert_eq!(target.hash_kv(0), source.hash_kv(0));
    assert_eq!(
        range(&target, req(all())),
        range(&source, req(all())),
        "after more commands"
    );
}
