//! Leases: attaching keys, and revoking them.

use super::*;

#[test]
fn leases_attach_keys_and_revoke_deletes_them_in_one_revision() {
    struct Step {
        name: &'static str,
        cmd: Command,
        output: Result<(), MvccError>,
        revision: i64,
    }
    let step = |name, cmd, output, revision| Step {
        name,
        cmd,
        output,
        revision,
    };
    let put_with = |key: &str, lease| Txn::new().then(op_put_lease(key, "v", lease)).cmd();
    let steps = vec![
        step("grant", Command::LeaseGrant { id: 1, ttl: 10 }, Ok(()), 0),
        step(
            "grant an existing id",
            Command::LeaseGrant { id: 1, ttl: 20 },
            Err(MvccError::LeaseExists),
            0,
        ),
        step(
            "grant too long a TTL",
            Command::LeaseGrant {
                id: 2,
                ttl: MAX_LEASE_TTL + 1,
            },
            Err(MvccError::LeaseTtlTooLarge),
            0,
        ),
        step("put k1 with the lease", put_with("k1", 1), Ok(()), 1),
        step("put k2 with the lease", put_with("k2", 1), Ok(()), 2),
        step("put k3 with the lease", put_with("k3", 1), Ok(()), 3),
        step(
            "put with an unknown lease",
            put_with("k4", 99),
            Err(MvccError::LeaseNotFound),
            3,
        ),
        step(
            "re-put k2 without the lease detaches it",
            put_with("k2", 0),
            Ok(()),
            4,
        ),
        step(
            "grant a second lease",
            Command::LeaseGrant { id: 3, ttl: 5 },
            Ok(()),
            4,
        ),
        step(
            "revoke deletes k1 and k3",
            Command::LeaseRevoke { id: 1 },
            Ok(()),
            5,
        ),
        step(
            "revoke again",
            Command::LeaseRevoke { id: 1 },
            Err(MvccError::LeaseNotFound),
            5,
        ),
        step(
            "revoke a lease without keys",
            Command::LeaseRevoke { id: 3 },
            Ok(()),
            5,
        ),
    ];
    let s = new_store();
    for st in steps {
        let applied = apply(&s, st.cmd);
        assert_eq!(applied.output.map(|_| ()), st.output, "{}", st.name);
        assert_eq!(applied.revision, st.revision, "{}", st.name);
        assert_eq!(s.revision(), st.revision, "{}", st.name);
        if st.name == "re-put k2 without the lease detaches it" {
            assert_eq!(s.lease_keys(1).expect("lease keys"), [b("k1"), b("k3")]);
            assert_eq!(get(&s, "k2").map(|kv| kv.lease), Some(0));
            assert_eq!(get(&s, "k1").map(|kv| kv.lease), Some(1));
            assert_eq!(get(&s, "k4"), None, "the refused put wrote nothing");
        }
    }
    assert_eq!(keys(&range(&s, req(all())).expect("range").kvs), ["k2"]);
    assert_eq!(s.leases().expect("leases"), Vec::<Lease>::new());
    assert_eq!(s.lease_keys(1).expect("lease keys"), Vec::<Vec<u8>>::new());
    let revoked = s.history(&all(), 5, 5, false, usize::MAX).expect("history");
    assert_eq!(revoked.len(), 1);
    assert_eq!(
        revoked[0]
            .events
            .iter()
            .map(|e| (e.kind, String::from_utf8_lossy(&e.kv.key).into_owned()))
            .collect::<Vec<_>>(),
        [
            (EventKind::Delete, "k1".to_string()),
            (EventKind::Delete, "k3".to_string())
        ]
    );
}

#[test]
fn a_key_deleted_in_the_txn_that_attached_it_is_no_longer_on_the_lease() {
    // validate_txn refuses this on the client path, but the state machine applies whatever
    // the log holds and must keep the lease index true to the keys.
    let cases = [
        (
            "put then delete",
            Txn::new()
                .then(op_put_lease("k", "v", 1))
                .then(op_del(KeyRange::single("k"))),
        ),
        (
            "put, then delete in a nested txn",
            Txn::new()
                .then(op_put_lease("k", "v", 1))
                .then(Txn::new().then(op_del(KeyRange::prefix("k"))).op()),
        ),
        (
            "put with the lease, then without",
            Txn::new()
                .then(op_put_lease("k", "v", 1))
                .then(op_put("k", "v")),
        ),
    ];
    for (name, t) in cases {
        let s = new_store();
        grant(&s, 1, 60);
        assert!(apply(&s, t.cmd()).output.is_ok(), "{name}");
        assert_eq!(
            s.lease_keys(1).expect("lease keys"),
            Vec::<Vec<u8>>::new(),
            "{name}"
        );
        put(&s, "k", "kept");
        apply(&s, Command::LeaseRevoke { id: 1 });
        assert_eq!(
            get(&s, "k").map(|kv| kv.value.to_vec()),
            Some(b("kept")),
            "{name}: revoking the lease must not delete a key it no longer holds"
        );
    }
}
