//! Range reads: selection, sorting, limits, filters, and reads at past revisions.

use super::*;

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
