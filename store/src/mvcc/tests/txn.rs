//! Transactions: compares, branches, reads of their own writes, and the checks etcd makes.

use super::*;

#[test]
fn txn_compares_like_etcd() {
    use CompareResult::*;
    use CompareTarget::*;
    let s = new_store();
    put(&s, "k", "v"); // 1
    put(&s, "k", "w"); // 2: k has create 1, mod 2, version 2, value "w", no lease
    grant(&s, 7, 60);
    put_lease(&s, "l", "x", 7); // 3
    let cases: Vec<(&str, Vec<Compare>, bool)> = vec![
        ("value equal", vec![cmp("k", Equal, Value(b("w")))], true),
        (
            "value equal, other",
            vec![cmp("k", Equal, Value(b("v")))],
            false,
        ),
        (
            "value not equal",
            vec![cmp("k", NotEqual, Value(b("v")))],
            true,
        ),
        ("value less", vec![cmp("k", Less, Value(b("x")))], true),
        ("value not less", vec![cmp("k", Less, Value(b("w")))], false),
        (
            "value greater",
            vec![cmp("k", Greater, Value(b("a")))],
            true,
        ),
        (
            "value not greater",
            vec![cmp("k", Greater, Value(b("x")))],
            false,
        ),
        ("version equal", vec![cmp("k", Equal, Version(2))], true),
        (
            "version not equal",
            vec![cmp("k", NotEqual, Version(2))],
            false,
        ),
        ("version less", vec![cmp("k", Less, Version(3))], true),
        (
            "version greater",
            vec![cmp("k", Greater, Version(2))],
            false,
        ),
        (
            "create equal",
            vec![cmp("k", Equal, CreateRevision(1))],
            true,
        ),
        (
            "create greater",
            vec![cmp("k", Greater, CreateRevision(0))],
            true,
        ),
        (
            "create less",
            vec![cmp("k", Less, CreateRevision(1))],
            false,
        ),
        ("mod equal", vec![cmp("k", Equal, ModRevision(2))], true),
        ("mod less", vec![cmp("k", Less, ModRevision(2))], false),
        ("mod greater", vec![cmp("k", Greater, ModRevision(1))], true),
        (
            "mod not equal",
            vec![cmp("k", NotEqual, ModRevision(1))],
            true,
        ),
        ("lease equal", vec![cmp("l", Equal, Lease(7))], true),
        ("lease not equal", vec![cmp("l", NotEqual, Lease(7))], false),
        ("no lease is lease 0", vec![cmp("k", Equal, Lease(0))], true),
        ("lease greater", vec![cmp("l", Greater, Lease(6))], true),
        ("lease less", vec![cmp("l", Less, Lease(7))], false),
        (
            "missing: version 0",
            vec![cmp("nope", Equal, Version(0))],
            true,
        ),
        (
            "missing: version > 0",
            vec![cmp("nope", Greater, Version(0))],
            false,
        ),
        (
            "missing: create 0",
            vec![cmp("nope", Equal, CreateRevision(0))],
            true,
        ),
        (
            "missing: mod 0",
            vec![cmp("nope", Equal, ModRevision(0))],
            true,
        ),
        ("missing: lease 0", vec![cmp("nope", Equal, Lease(0))], true),
        (
            "missing: a value equal is false",
            vec![cmp("nope", Equal, Value(vec![]))],
            false,
        ),
        (
            "missing: a value not equal is false too",
            vec![cmp("nope", NotEqual, Value(b("x")))],
            false,
        ),
        (
            "a range compare holds for every key",
            vec![Compare {
                range: between("k", "m"),
                result: Greater,
                target: Version(0),
            }],
            true,
        ),
        (
            "a range compare fails if one key fails",
            vec![Compare {
                range: between("k", "m"),
                result: Equal,
                target: Version(2),
            }],
            false,
        ),
        (
            "all compares hold",
            vec![
                cmp("k", Equal, Version(2)),
                cmp("l", Equal, Lease(7)),
                cmp("nope", Equal, CreateRevision(0)),
            ],
            true,
        ),
        (
            "one compare fails",
            vec![cmp("k", Equal, Version(2)), cmp("l", Equal, Lease(8))],
            false,
        ),
        ("no compare succeeds", vec![], true),
    ];
    for (name, compares, want) in cases {
        let mut t = Txn::new()
            .then(op_get("k"))
            .otherwise(op_get("l"))
            .otherwise(op_get("l"));
        t.0.compare = compares;
        let applied = apply(&s, t.cmd());
        let result = txn_result(&applied);
        assert_eq!(result.succeeded, want, "{name}");
        // The branch that ran: one response on success, two on failure.
        assert_eq!(
            result.responses.len(),
            if want { 1 } else { 2 },
            "{name}: responses"
        );
        assert_eq!(applied.revision, 3, "{name}: a read-only txn");
    }
}

#[test]
fn txn_runs_only_the_chosen_branch() {
    let cases = [
        ("compare holds", "v", "then", "else"),
        ("compare fails", "other", "else", "then"),
    ];
    for (name, compared, written, untouched) in cases {
        let s = new_store();
        put(&s, "k", "v");
        let applied = apply(
            &s,
            Txn::new()
                .when(cmp(
                    "k",
                    CompareResult::Equal,
                    CompareTarget::Value(b(compared)),
                ))
                .then(op_put("then", "1"))
                .otherwise(op_put("else", "1"))
                .cmd(),
        );
        assert_eq!(applied.revision, 2, "{name}");
        assert_eq!(get(&s, written), Some(kv(written, "1", 2, 2, 1)), "{name}");
        assert_eq!(get(&s, untouched), None, "{name}");
    }
}

#[test]
fn txn_reads_see_earlier_writes_and_nested_compares_see_the_state_before() {
    let s = new_store();
    put(&s, "a", "old"); // 1
    put(&s, "c", "x"); // 2
    let nested = Txn::new()
        // As in etcd, every compare of a transaction, nested ones included, is evaluated
        // against the state before the transaction.
        .when(cmp(
            "a",
            CompareResult::Equal,
            CompareTarget::Value(b("old")),
        ))
        .when(cmp("b", CompareResult::Equal, CompareTarget::Version(0)))
        .when(cmp("c", CompareResult::Greater, CompareTarget::Version(0)))
        .then(op_get("a"))
        .then(op_get("c"));
    let applied = apply(
        &s,
        Txn::new()
            .then(op_put("a", "new"))
            .then(op_get("a"))
            .then(op_put("b", "1"))
            .then(op_range(all()))
            .then(op_del(KeyRange::single("c")))
            .then(op_range(all()))
            .then(nested.op())
            .cmd(),
    );
    assert_eq!(applied.revision, 3);
    let r = txn_result(&applied);
    assert!(r.succeeded);
    let a = kv("a", "new", 1, 3, 2);
    let b1 = kv("b", "1", 3, 3, 1);
    assert_eq!(
        range_response(&r.responses[1]).kvs,
        std::slice::from_ref(&a)
    );
    assert_eq!(
        range_response(&r.responses[3]).kvs,
        [a.clone(), b1.clone(), kv("c", "x", 2, 2, 1)]
    );
    assert_eq!(
        r.responses[4],
        OpResult::Delete(DeleteResult {
            deleted: 1,
            prev_kvs: vec![]
        })
    );
    assert_eq!(range_response(&r.responses[5]).kvs, [a.clone(), b1]);
    let OpResult::Txn(inner) = &r.responses[6] else {
        panic!("expected the nested txn's result, got {:?}", r.responses[6]);
    };
    assert!(
        inner.succeeded,
        "nested compares see the state before the txn"
    );
    // ... while the nested reads see the writes before them.
    assert_eq!(range_response(&inner.responses[0]).kvs, [a]);
    assert_eq!(
        range_response(&inner.responses[1]).kvs,
        Vec::<KeyValue>::new()
    );
}

#[test]
fn refused_txn_changes_nothing() {
    let s = new_store();
    put(&s, "k", "v"); // 1
    let applied = apply(
        &s,
        Txn::new()
            .then(op_put("k", "changed"))
            .then(op_put_lease("other", "x", 42))
            .cmd(),
    );
    assert_eq!(applied.output, Err(MvccError::LeaseNotFound));
    assert_eq!(applied.revision, 1);
    assert_eq!(s.revision(), 1);
    assert_eq!(get(&s, "k"), Some(kv("k", "v", 1, 1, 1)));
    assert_eq!(get(&s, "other"), None);
}

#[test]
fn validate_txn_refuses_what_etcd_refuses() {
    let put_op = |key: &str| op_put(key, "v");
    let del_op = |range: KeyRange| op_del(range);
    let cases: Vec<(&str, Txn, Result<(), MvccError>)> = vec![
        (
            "different keys",
            Txn::new().then(put_op("a")).then(put_op("b")),
            Ok(()),
        ),
        (
            "one key put twice in one branch",
            Txn::new().then(put_op("a")).then(put_op("a")),
            Err(MvccError::DuplicateKey),
        ),
        (
            "one key put twice in the failure branch",
            Txn::new()
                .otherwise(put_op("a"))
                .otherwise(put_op("b"))
                .otherwise(put_op("a")),
            Err(MvccError::DuplicateKey),
        ),
        (
            "one key in both branches",
            Txn::new().then(put_op("a")).otherwise(put_op("a")),
            Ok(()),
        ),
        (
            "a key put and deleted in one branch",
            Txn::new()
                .then(del_op(KeyRange::single("a")))
                .then(put_op("a")),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a key put inside a deleted range",
            Txn::new()
                .then(put_op("ab"))
                .then(del_op(KeyRange::prefix("a"))),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a put outside a deleted range",
            Txn::new()
                .then(put_op("b"))
                .then(del_op(KeyRange::prefix("a"))),
            Ok(()),
        ),
        (
            "a key put and deleted in different branches",
            Txn::new()
                .then(put_op("a"))
                .otherwise(del_op(KeyRange::single("a"))),
            Ok(()),
        ),
        (
            "a key put in a txn and in a nested txn",
            Txn::new()
                .then(put_op("a"))
                .then(Txn::new().then(put_op("a")).op()),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a key put in both branches of a nested txn",
            Txn::new().then(Txn::new().then(put_op("a")).otherwise(put_op("a")).op()),
            Ok(()),
        ),
        (
            "a key put in two nested txns",
            Txn::new()
                .then(Txn::new().then(put_op("a")).op())
                .then(Txn::new().otherwise(put_op("a")).op()),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a key put in a txn and deleted in a nested txn",
            Txn::new()
                .then(put_op("a"))
                .then(Txn::new().then(del_op(KeyRange::single("a"))).op()),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a key deleted in a txn and put in a nested txn",
            Txn::new()
                .then(del_op(KeyRange::prefix("a")))
                .then(Txn::new().otherwise(put_op("ab")).op()),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a duplicate inside a nested txn",
            Txn::new().then(Txn::new().then(put_op("a")).then(put_op("a")).op()),
            Err(MvccError::DuplicateKey),
        ),
        (
            "a from-key delete and a put, which etcd lets through",
            Txn::new().then(put_op("b")).then(del_op(from_key("a"))),
            Ok(()),
        ),
        (
            "an empty key",
            Txn::new().then(put_op("")),
            Err(MvccError::EmptyKey),
        ),
        (
            "an empty key in a nested txn",
            Txn::new().then(Txn::new().otherwise(op_get("")).op()),
            Err(MvccError::EmptyKey),
        ),
        (
            "an empty compare key",
            Txn::new().when(cmp("", CompareResult::Equal, CompareTarget::Version(0))),
            Err(MvccError::EmptyKey),
        ),
        (
            "ignore_value with a value",
            Txn::new().then(Op::Put(PutRequest {
                key: b("a"),
                value: b("v"),
                ignore_value: true,
                ..Default::default()
            })),
            Err(MvccError::ValueProvided),
        ),
        (
            "ignore_lease with a lease",
            Txn::new().then(Op::Put(PutRequest {
                key: b("a"),
                lease: 1,
                ignore_lease: true,
                ..Default::default()
            })),
            Err(MvccError::LeaseProvided),
        ),
        (
            "too many operations",
            (0..=MAX_TXN_OPS).fold(Txn::new(), |t, i| t.then(put_op(&format!("k{i}")))),
            Err(MvccError::TooManyOps),
        ),
        (
            "as many operations as etcd allows",
            (0..MAX_TXN_OPS).fold(Txn::new(), |t, i| t.then(put_op(&format!("k{i}")))),
            Ok(()),
        ),
    ];
    for (name, t, want) in cases {
        assert_eq!(validate_txn(&t.0), want, "{name}");
    }
}
