//! Revisions, versions and create/mod revisions as etcd gives them.

use super::*;

#[test]
fn revisions_and_versions_follow_etcd() {
    struct Step {
        name: &'static str,
        cmd: Command,
        revision: i64,
        /// `k` afterwards: (value, create_revision, mod_revision, version).
        k: Option<(&'static str, i64, i64, i64)>,
    }
    let steps = vec![
        Step {
            name: "a create is revision 1, version 1",
            cmd: cmd_put("k", "v1"),
            revision: 1,
            k: Some(("v1", 1, 1, 1)),
        },
        Step {
            name: "a put again keeps create_revision and bumps version",
            cmd: cmd_put("k", "v2"),
            revision: 2,
            k: Some(("v2", 1, 2, 2)),
        },
        Step {
            name: "a delete bumps the revision",
            cmd: Txn::new().then(op_del(KeyRange::single("k"))).cmd(),
            revision: 3,
            k: None,
        },
        Step {
            name: "a delete of nothing does not bump the revision",
            cmd: Txn::new().then(op_del(KeyRange::single("k"))).cmd(),
            revision: 3,
            k: None,
        },
        Step {
            name: "a range delete of nothing does not bump the revision",
            cmd: Txn::new().then(op_del(KeyRange::prefix("zz"))).cmd(),
            revision: 3,
            k: None,
        },
        Step {
            name: "a re-create resets create_revision and restarts version at 1",
            cmd: cmd_put("k", "v3"),
            revision: 4,
            k: Some(("v3", 4, 4, 1)),
        },
        Step {
            name: "a read-only txn does not bump the revision",
            cmd: Txn::new().then(op_get("k")).then(op_range(all())).cmd(),
            revision: 4,
            k: Some(("v3", 4, 4, 1)),
        },
        Step {
            name: "a txn whose compare fails with an empty failure branch changes nothing",
            cmd: Txn::new()
                .when(cmp(
                    "k",
                    CompareResult::Equal,
                    CompareTarget::Value(b("other")),
                ))
                .then(op_put("k", "never"))
                .cmd(),
            revision: 4,
            k: Some(("v3", 4, 4, 1)),
        },
        Step {
            name: "a txn with several puts is one revision",
            cmd: Txn::new()
                .then(op_put("k", "v4"))
                .then(op_put("other", "x"))
                .then(op_put("third", "y"))
                .cmd(),
            revision: 5,
            k: Some(("v4", 4, 5, 2)),
        },
        Step {
            name: "a delete of several keys is one revision",
            cmd: Txn::new().then(op_del(all())).cmd(),
            revision: 6,
            k: None,
        },
        Step {
            name: "a lease grant does not bump the revision",
            cmd: Command::LeaseGrant { id: 1, ttl: 10 },
            revision: 6,
            k: None,
        },
        Step {
            name: "a compaction does not bump the revision",
            cmd: Command::Compact { revision: 5 },
            revision: 6,
            k: None,
        },
    ];
    let s = new_store();
    for step in steps {
        let applied = apply(&s, step.cmd);
        assert!(
            applied.output.is_ok(),
            "{}: {:?}",
            step.name,
            applied.output
        );
        assert_eq!(applied.revision, step.revision, "{}: applied", step.name);
        assert_eq!(s.revision(), step.revision, "{}: store", step.name);
        let want = step
            .k
            .map(|(value, create, modified, version)| kv("k", value, create, modified, version));
        assert_eq!(get(&s, "k"), want, "{}", step.name);
    }
    // The three puts of revision 5 share it, in order, as sub-revisions of one batch.
    let batches = s.history(&all(), 5, 5, false, usize::MAX).expect("history");
    assert_eq!(batches.len(), 1);
    assert_eq!(
        keys(
            &batches[0]
                .events
                .iter()
                .map(|e| e.kv.clone())
                .collect::<Vec<_>>()
        ),
        ["k", "other", "third"]
    );
    assert!(batches[0].events.iter().all(|e| e.kv.mod_revision == 5));
}
