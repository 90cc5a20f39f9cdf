//! etcd's MVCC semantics, checked against the store directly: revisions and versions, ranges,
//! reads at past revisions, transactions, compaction, leases, watchers, and snapshots.
//!
//! Each test builds its state from commands through a tiny helper layer (`put`, `del`, `Txn`,
//! `get`, ...) so that a case reads like the etcdctl session it stands for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::store::MAX_TXN_OPS;
use super::watch::{self, WatchMessage, WatchSpec};
use super::*;
use crate::error::MvccError;

// ---- helpers ----

fn new_store() -> Arc<MvccStore> {
    let db = sled::Config::new()
        .temporary(true)
        .open()
        .expect("temporary sled db opens");
    Arc::new(MvccStore::open(&db).expect("mvcc store opens"))
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

fn apply(s: &MvccStore, cmd: Command) -> Applied {
    s.apply(&cmd, Vec::new()).expect("storage does not fail")
}

fn put(s: &MvccStore, key: &str, value: &str) -> Applied {
    apply(s, cmd_put(key, value))
}

fn put_lease(s: &MvccStore, key: &str, value: &str, lease: i64) -> Applied {
    apply(s, Txn::new().then(op_put_lease(key, value, lease)).cmd())
}

fn del(s: &MvccStore, range: KeyRange) -> Applied {
    apply(s, Txn::new().then(op_del(range)).cmd())
}

fn grant(s: &MvccStore, id: i64, ttl: i64) -> Applied {
    apply(s, Command::LeaseGrant { id, ttl })
}

fn cmd_put(key: &str, value: &str) -> Command {
    Txn::new().then(op_put(key, value)).cmd()
}

fn op_put(key: &str, value: &str) -> Op {
    op_put_lease(key, value, 0)
}

fn op_put_lease(key: &str, value: &str, lease: i64) -> Op {
    Op::Put(PutRequest {
        key: b(key),
        value: b(value),
        lease,
        ..Default::default()
    })
}

fn op_del(range: KeyRange) -> Op {
    Op::Delete(DeleteRequest {
        range,
        prev_kv: false,
    })
}

fn op_get(key: &str) -> Op {
    Op::Range(req(KeyRange::single(key)))
}

fn op_range(range: KeyRange) -> Op {
    Op::Range(req(range))
}

fn cmp(key: &str, result: CompareResult, target: CompareTarget) -> Compare {
    Compare {
        range: KeyRange::single(key),
        result,
        target,
    }
}

/// Builds a transaction: `Txn::new().when(..).then(..).otherwise(..)`.
#[derive(Default, Clone)]
struct Txn(TxnRequest);

impl Txn {
    fn new() -> Self {
        Self::default()
    }
    fn when(mut self, c: Compare) -> Self {
        self.0.compare.push(c);
        self
    }
    fn then(mut self, op: Op) -> Self {
        self.0.success.push(op);
        self
    }
    fn otherwise(mut self, op: Op) -> Self {
        self.0.failure.push(op);
        self
    }
    fn op(self) -> Op {
        Op::Txn(self.0)
    }
    fn cmd(self) -> Command {
        Command::Txn(self.0)
    }
}

/// Every key: etcd's `key = range_end = "\0"`.
fn all() -> KeyRange {
    KeyRange {
        key: vec![0],
        range_end: vec![0],
    }
}

fn between(key: &str, range_end: &str) -> KeyRange {
    KeyRange {
        key: b(key),
        range_end: b(range_end),
    }
}

/// Every key from `key` on: etcd's `range_end = "\0"`.
fn from_key(key: &str) -> KeyRange {
    KeyRange {
        key: b(key),
        range_end: vec![0],
    }
}

fn req(range: KeyRange) -> RangeRequest {
    RangeRequest {
        range,
        ..Default::default()
    }
}

fn range(s: &MvccStore, r: RangeRequest) -> Result<RangeResult, MvccError> {
    s.range(&r).map(|(result, _)| result)
}

fn get(s: &MvccStore, key: &str) -> Option<KeyValue> {
    get_at(s, key, 0).expect("a read at the newest revision works")
}

fn get_at(s: &MvccStore, key: &str, revision: i64) -> Result<Option<KeyValue>, MvccError> {
    let r = range(
        s,
        RangeRequest {
            revision,
            ..req(KeyRange::single(key))
        },
    )?;
    assert!(r.kvs.len() <= 1, "a single key read returned {:?}", r.kvs);
    Ok(r.kvs.into_iter().next())
}

/// What a read returns.
type Read = Result<Vec<KeyValue>, MvccError>;

/// Watch messages as (revision, events).
type Messages = Vec<(i64, Vec<Event>)>;

fn keys(kvs: &[KeyValue]) -> Vec<String> {
    kvs.iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect()
}

fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> KeyValue {
    KeyValue {
        key: b(key),
        create_revision: create,
        mod_revision: modified,
        version,
        value: b(value),
        lease: 0,
    }
}

fn txn_result(applied: &Applied) -> &TxnResult {
    match &applied.output {
        Ok(Output::Txn(t)) => t,
        other => panic!("expected a transaction result, got {other:?}"),
    }
}

fn range_response(op: &OpResult) -> &RangeResult {
    match op {
        OpResult::Range(r) => r,
        other => panic!("expected a range response, got {other:?}"),
    }
}

// ---- revisions and versions ----

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

// ---- range ----

/// Five keys whose key, version, create, mod and value orders all differ:
///
/// | key | value | create | mod | version |
/// |-----|-------|--------|-----|---------|
/// | a   | m     | 5      | 15  | 3       |
/// | ab  | z     | 4      | 4   | 1       |
/// | abc | k     | 3      | 12  | 2       |
/// | b   | a     | 2      | 14  | 5       |
/// | c   | q     | 1      | 13  | 4       |
fn range_fixture() -> (Arc<MvccStore>, BTreeMap<String, KeyValue>) {
    let values = BTreeMap::from([
        ("a", "m"),
        ("ab", "z"),
        ("abc", "k"),
        ("b", "a"),
        ("c", "q"),
    ]);
    let s = new_store();
    let order = [
        "c", "b", "abc", "ab", "a", "b", "c", "b", "a", "c", "b", "abc", "c", "b", "a",
    ];
    for key in order {
        put(&s, key, values[key]);
    }
    assert_eq!(s.revision(), 15);
    let want = [
        kv("a", "m", 5, 15, 3),
        kv("ab", "z", 4, 4, 1),
        kv("abc", "k", 3, 12, 2),
        kv("b", "a", 2, 14, 5),
        kv("c", "q", 1, 13, 4),
    ];
    let by_key = want
        .into_iter()
        .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), kv))
        .collect();
    (s, by_key)
}

#[test]
fn range_selects_sorts_limits_and_filters_like_etcd() {
    use SortOrder::{Ascend, Descend};
    use SortTarget::{Create, Key, Mod, Value, Version};
    struct Case {
        name: &'static str,
        req: RangeRequest,
        keys: Vec<&'static str>,
        more: bool,
        count: i64,
    }
    let case = |name, req, keys: &[&'static str], more, count| Case {
        name,
        req,
        keys: keys.to_vec(),
        more,
        count,
    };
    let sorted = |range: KeyRange, order, target| RangeRequest {
        sort_order: order,
        sort_target: target,
        ..req(range)
    };
    let cases = vec![
        case("single key", req(KeyRange::single("ab")), &["ab"], false, 1),
        case("missing key", req(KeyRange::single("zz")), &[], false, 0),
        case(
            "prefix",
            req(KeyRange::prefix("ab")),
            &["ab", "abc"],
            false,
            2,
        ),
        case(
            "[a, b)",
            req(between("a", "b")),
            &["a", "ab", "abc"],
            false,
            3,
        ),
        case(
            "[ab, c)",
            req(between("ab", "c")),
            &["ab", "abc", "b"],
            false,
            3,
        ),
        case(
            "from key",
            req(from_key("abc")),
            &["abc", "b", "c"],
            false,
            3,
        ),
        case(
            "all keys",
            req(all()),
            &["a", "ab", "abc", "b", "c"],
            false,
            5,
        ),
        case(
            "limit below the count sets more",
            RangeRequest {
                limit: 2,
                ..req(all())
            },
            &["a", "ab"],
            true,
            5,
        ),
        case(
            "limit equal to the count",
            RangeRequest {
                limit: 5,
                ..req(all())
            },
            &["a", "ab", "abc", "b", "c"],
            false,
            5,
        ),
        case(
            "limit above the count",
            RangeRequest {
                limit: 2,
                ..req(KeyRange::prefix("ab"))
            },
            &["ab", "abc"],
            false,
            2,
        ),
        case(
            "count only",
            RangeRequest {
                count_only: true,
                ..req(KeyRange::prefix("ab"))
            },
            &[],
            false,
            2,
        ),
        case(
            "keys only",
            RangeRequest {
                keys_only: true,
                ..req(between("a", "b"))
            },
            &["a", "ab", "abc"],
            false,
            3,
        ),
        case(
            "key descending",
            sorted(all(), Descend, Key),
            &["c", "b", "abc", "ab", "a"],
            false,
            5,
        ),
        case(
            "key ascending",
            sorted(all(), Ascend, Key),
            &["a", "ab", "abc", "b", "c"],
            false,
            5,
        ),
        case(
            "a target without an order sorts ascending",
            sorted(all(), SortOrder::None, Version),
            &["ab", "abc", "a", "c", "b"],
            false,
            5,
        ),
        case(
            "version descending",
            sorted(all(), Descend, Version),
            &["b", "c", "a", "abc", "ab"],
            false,
            5,
        ),
        case(
            "create ascending",
            sorted(all(), Ascend, Create),
            &["c", "b", "abc", "ab", "a"],
            false,
            5,
        ),
        case(
            "mod ascending",
            sorted(all(), Ascend, Mod),
            &["ab", "abc", "c", "b", "a"],
            false,
            5,
        ),
        case(
            "value ascending",
            sorted(all(), Ascend, Value),
            &["b", "abc", "a", "c", "ab"],
            false,
            5,
        ),
        case(
            "value descending",
            sorted(all(), Descend, Value),
            &["ab", "c", "a", "abc", "b"],
            false,
            5,
        ),
        case(
            "limit applies after the sort",
            RangeRequest {
                limit: 2,
                ..sorted(all(), Descend, Mod)
            },
            &["a", "b"],
            true,
            5,
        ),
        case(
            "min mod revision",
            RangeRequest {
                min_mod_revision: 13,
                ..req(all())
            },
            &["a", "b", "c"],
            false,
            5,
        ),
        case(
            "max mod revision",
            RangeRequest {
                max_mod_revision: 12,
                ..req(all())
            },
            &["ab", "abc"],
            false,
            5,
        ),
        case(
            "min create revision",
            RangeRequest {
                min_create_revision: 4,
                ..req(all())
            },
            &["a", "ab"],
            false,
            5,
        ),
        case(
            "max create revision",
            RangeRequest {
                max_create_revision: 2,
                ..req(all())
            },
            &["b", "c"],
            false,
            5,
        ),
        case(
            "filters combine",
            RangeRequest {
                min_mod_revision: 5,
                max_create_revision: 3,
                ..req(all())
            },
            &["abc", "b", "c"],
            false,
            5,
        ),
        case(
            "limit applies after the filters",
            RangeRequest {
                min_mod_revision: 13,
                limit: 2,
                ..req(all())
            },
            &["a", "b"],
            true,
            5,
        ),
    ];
    let (s, full) = range_fixture();
    for c in cases {
        let got = range(&s, c.req.clone()).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        assert_eq!(keys(&got.kvs), c.keys, "{}: keys", c.name);
        assert_eq!(got.more, c.more, "{}: more", c.name);
        assert_eq!(got.count, c.count, "{}: count", c.name);
        for kv in &got.kvs {
            let mut want = full[&String::from_utf8_lossy(&kv.key).into_owned()].clone();
            if c.req.keys_only {
                want.value.clear();
            }
            assert_eq!(kv, &want, "{}: record", c.name);
        }
    }
}

#[test]
fn range_at_a_past_revision_sees_that_revision() {
    let s = new_store();
    put(&s, "k", "v1"); // 1
    put(&s, "k", "v2"); // 2
    del(&s, KeyRange::single("k")); // 3
    put(&s, "other", "o"); // 4
    put(&s, "k", "v3"); // 5
    let at = |range: KeyRange, revision| RangeRequest {
        revision,
        ..req(range)
    };
    let cases: Vec<(&str, RangeRequest, Read)> = vec![
        (
            "the first version",
            at(KeyRange::single("k"), 1),
            Ok(vec![kv("k", "v1", 1, 1, 1)]),
        ),
        (
            "the second version",
            at(KeyRange::single("k"), 2),
            Ok(vec![kv("k", "v2", 1, 2, 2)]),
        ),
        (
            "nothing at the deletion",
            at(KeyRange::single("k"), 3),
            Ok(vec![]),
        ),
        (
            "nothing after the deletion",
            at(KeyRange::single("k"), 4),
            Ok(vec![]),
        ),
        (
            "the new generation",
            at(KeyRange::single("k"), 5),
            Ok(vec![kv("k", "v3", 5, 5, 1)]),
        ),
        (
            "zero reads the newest",
            at(KeyRange::single("k"), 0),
            Ok(vec![kv("k", "v3", 5, 5, 1)]),
        ),
        (
            "nothing before creation",
            at(KeyRange::single("other"), 3),
            Ok(vec![]),
        ),
        (
            "every key at 2",
            at(all(), 2),
            Ok(vec![kv("k", "v2", 1, 2, 2)]),
        ),
        (
            "every key at 4",
            at(all(), 4),
            Ok(vec![kv("other", "o", 4, 4, 1)]),
        ),
        (
            "a prefix at 1",
            at(KeyRange::prefix("k"), 1),
            Ok(vec![kv("k", "v1", 1, 1, 1)]),
        ),
        (
            "the next revision is in the future",
            at(KeyRange::single("k"), 6),
            Err(MvccError::FutureRevision),
        ),
        (
            "a far revision is in the future",
            at(all(), 100),
            Err(MvccError::FutureRevision),
        ),
    ];
    for (name, r, want) in cases {
        assert_eq!(range(&s, r).map(|r| r.kvs), want, "{name}");
    }
}

// ---- transactions ----

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

// ---- compaction ----

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

// ---- leases ----

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
            get(&s, "k").map(|kv| kv.value),
            Some(b("kept")),
            "{name}: revoking the lease must not delete a key it no longer holds"
        );
    }
}

// ---- watch ----

const WAIT: Duration = Duration::from_secs(10);

async fn next(rx: &mut tokio::sync::mpsc::Receiver<WatchMessage>) -> WatchMessage {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a watch message within the timeout")
        .expect("the watcher is still running")
}

fn put_event(key: &str, value: &str, create: i64, modified: i64, version: i64) -> Event {
    Event {
        kind: EventKind::Put,
        kv: kv(key, value, create, modified, version),
        prev_kv: None,
    }
}

fn delete_event(key: &str, modified: i64) -> Event {
    Event {
        kind: EventKind::Delete,
        kv: KeyValue {
            key: b(key),
            mod_revision: modified,
            ..Default::default()
        },
        prev_kv: None,
    }
}

fn with_prev(mut e: Event, prev: KeyValue) -> Event {
    e.prev_kv = Some(prev);
    e
}

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

// ---- snapshots ----

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

// ---- alarms ----

fn alarm(s: &MvccStore, activate: bool, member: u64) -> Applied {
    apply(
        s,
        Command::Alarm {
            activate,
            member,
            alarm: AlarmKind::NoSpace,
        },
    )
}

#[test]
fn a_nospace_alarm_refuses_what_takes_space_and_nothing_else() {
    let s = new_store();
    put(&s, "a", "1");
    grant(&s, 7, 60);
    let raised = alarm(&s, true, 3);
    assert_eq!(
        raised.revision, 1,
        "an alarm is not a revision of the keyspace"
    );
    let nospace = Alarm {
        member: 3,
        kind: AlarmKind::NoSpace,
    };
    assert_eq!(raised.output, Ok(Output::Alarms(vec![nospace])));
    // Raising it again changes nothing.
    assert_eq!(alarm(&s, true, 3).output, Ok(Output::Alarms(vec![])));
    assert_eq!(s.alarms().expect("alarms"), [nospace]);

    let refused: [(&str, Command); 4] = [
        ("put", cmd_put("b", "2")),
        ("lease grant", Command::LeaseGrant { id: 8, ttl: 60 }),
        (
            "txn with a put in its failure branch",
            Txn::new()
                .when(cmp("a", CompareResult::Equal, CompareTarget::Value(b("1"))))
                .then(op_get("a"))
                .otherwise(op_put("c", "3"))
                .cmd(),
        ),
        (
            "nested txn with a put",
            Txn::new()
                .then(Op::Txn(TxnRequest {
                    success: vec![op_put("d", "4")],
                    ..Default::default()
                }))
                .cmd(),
        ),
    ];
    for (what, cmd) in refused {
        assert!(cmd.takes_space(), "{what}");
        let applied = apply(&s, cmd);
        assert_eq!(applied.output, Err(MvccError::NoSpace), "{what}");
        assert_eq!(applied.revision, 1, "{what} changed the store");
    }

    // Reads, deletes, revokes and compaction free space and go through.
    let accepted: [(&str, Command); 4] = [
        ("read-only txn", Txn::new().then(op_get("a")).cmd()),
        (
            "delete",
            Txn::new().then(op_del(KeyRange::single("a"))).cmd(),
        ),
        ("lease revoke", Command::LeaseRevoke { id: 7 }),
        ("compaction", Command::Compact { revision: 2 }),
    ];
    for (what, cmd) in accepted {
        assert!(!cmd.takes_space(), "{what}");
        assert!(apply(&s, cmd).output.is_ok(), "{what}");
    }
    assert_eq!(get(&s, "a"), None);

    // Disarmed, writes are accepted again.
    assert_eq!(
        alarm(&s, false, 3).output,
        Ok(Output::Alarms(vec![nospace]))
    );
    assert!(s.alarms().expect("alarms").is_empty());
    assert!(put(&s, "b", "2").output.is_ok());
}

/// A tracked watcher counts as delivered up to a revision only once its consumer has passed
/// on every message it was sent: what a progress notification may promise.
#[tokio::test]
async fn a_tracked_watcher_is_delivered_only_up_to_what_its_consumer_passed_on() {
    let s = new_store();
    put(&s, "a", "1"); // 1
    let (mut rx, delivery) = watch::start_tracked(
        s.clone(),
        WatchSpec {
            range: KeyRange::single("a"),
            ..Default::default()
        },
        16,
    );
    assert_eq!(
        delivery.delivered(),
        Some(1),
        "nothing sent yet: in sync at the start"
    );
    put(&s, "a", "2"); // 2
    put(&s, "b", "1"); // 3, outside the range
    let WatchMessage::Events { revision: 2, .. } = next(&mut rx).await else {
        panic!("the event of revision 2 first")
    };
    // Received but not yet passed on: not delivered, whatever the store's revision.
    assert_eq!(delivery.delivered(), None);
    delivery.passed_one();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while delivery.delivered() != Some(3) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "revision 3 (no event in range) never counted as delivered: {:?}",
            delivery.delivered()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

// ---- staged changes ----

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
        bincode::serialize(&staged.dump().expect("dump")).expect("encode"),
        bincode::serialize(&one_by_one.dump().expect("dump")).expect("encode"),
        "the same trees"
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
    let staged_before = vec![
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
        bincode::serialize(&staged.dump().expect("dump")).expect("encode"),
        bincode::serialize(&one_by_one.dump().expect("dump")).expect("encode"),
        "the same trees"
    );
    assert_eq!(
        range(&staged, req(all())).expect("range").kvs,
        vec![kv("l", "outside the range", before + 3, before + 3, 1)]
    );
}

fn put_cmd_lease(key: &str, value: &str, lease: i64) -> Command {
    Txn::new().then(op_put_lease(key, value, lease)).cmd()
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
    let next = vec![
        cmd_put("a", "2"),
        put_cmd_lease("b", "2", 5),
        cmd_put("c", "2"),
        Txn::new().then(op_del(KeyRange::single("a"))).cmd(),
        cmd_put("d", "1"),
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
    let dump =
        |store: &MvccStore| bincode::serialize(&store.dump().expect("dump")).expect("encode");

    let whole_dir = tempfile::tempdir().expect("tempdir");
    let (_db, whole) = open(whole_dir.path());
    for c in base() {
        apply(&whole, c);
    }
    let before = (dump(&whole), whole.revision());
    let (writes, history) = stage(&whole).into_commit().write_count();
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
            "after {kept} of {writes} writes ({history} history records) the store holds {} \
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
    let dump =
        |store: &MvccStore| bincode::serialize(&store.dump().expect("dump")).expect("encode");
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
                    (String::from_utf8(e.kv.key).expect("utf-8"), prev)
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
