//! Linearizability: the operations a client saw, the verdict, and the per-key-group
//! check that drives the search.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::search::{Outcome, Search};

// ---------------------------------------------------------------------------------------------
// Linearizability
// ---------------------------------------------------------------------------------------------

/// One client operation as the client saw it. Times are nanoseconds since the campaign began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub client: usize,
    pub call: u64,
    /// When the answer came; None: no answer (timeout, connection lost): it may have taken
    /// effect at any time after `call`, or never.
    pub ret: Option<u64>,
    /// The keys this op touches, in a fixed order; ops are checked per group of keys (ops with
    /// the same `keys` vector form one independent sub-history; linearizability is local).
    pub keys: Vec<String>,
    pub kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Read every key: what was returned (None: key absent). Only answered reads are recorded.
    Read { got: Vec<Option<String>> },
    /// Unconditional put of one value per key.
    Put { values: Vec<String> },
    /// If every key currently equals `expect` (None: absent), put `values`; `ok` is the answer
    /// (Some(true) applied, Some(false) compare failed, None: unknown because no answer).
    Cas {
        expect: Vec<Option<String>>,
        values: Vec<String>,
        ok: Option<bool>,
    },
}

/// The outcome of [`linearizable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// None: the search gave up at the deadline, which says nothing either way.
    pub linearizable: Option<bool>,
    /// Ops checked (unanswered reads are left out: they constrain nothing).
    pub ops: usize,
    /// Independent key groups.
    pub groups: usize,
    /// The group and a short explanation: the ops around the point no order could get past,
    /// or which groups were left unchecked at the deadline.
    pub failure: Option<String>,
}

/// Whether `history` is linearizable, key group by key group, against registers that start
/// absent. An op without an answer may take effect at any point after its call, or never.
/// Gives up (`linearizable: None`) when `budget` runs out; it never reports a history it did
/// not finish as linearizable.
///
/// Every group first gets an equal share of what is left of the budget, so that one hard group
/// cannot keep the others from being checked; groups that ran out get a second try with all the
/// time left.
pub fn linearizable(history: &[Op], budget: Duration) -> Verdict {
    let started = Instant::now();
    let deadline = started
        .checked_add(budget)
        .unwrap_or(started + Duration::from_secs(86_400 * 365));
    let groups = match group_ops(history) {
        Ok(g) => g,
        Err(malformed) => {
            return Verdict {
                linearizable: Some(false),
                ops: history.len(),
                groups: 0,
                failure: Some(malformed),
            }
        }
    };
    let ops = groups.iter().map(|g| g.ops.len()).sum();
    let mut pending: Vec<usize> = (0..groups.len()).collect();
    for _pass in 0..2 {
        let mut gave_up = Vec::new();
        let n = pending.len();
        for (i, &g) in pending.iter().enumerate() {
            let now = Instant::now();
            let share = deadline.saturating_duration_since(now) / (n - i) as u32;
            match Search::new(history, &groups[g]).run(now + share) {
                Outcome::Linearizable => {}
                Outcome::Not(why) => {
                    return Verdict {
                        linearizable: Some(false),
                        ops,
                        groups: groups.len(),
                        failure: Some(why),
                    }
                }
                Outcome::GaveUp => gave_up.push(g),
            }
        }
        pending = gave_up;
        if pending.is_empty() {
            break;
        }
    }
    let failure = (!pending.is_empty()).then(|| {
        let named: Vec<String> = pending
            .iter()
            .take(5)
            .map(|&g| format!("[{}]", groups[g].keys.join(", ")))
            .collect();
        format!(
            "gave up after {:.1} s: {} of {} key groups not decided ({}{})",
            started.elapsed().as_secs_f64(),
            pending.len(),
            groups.len(),
            named.join(", "),
            if pending.len() > 5 { ", ..." } else { "" }
        )
    });
    Verdict {
        linearizable: if pending.is_empty() { Some(true) } else { None },
        ops,
        groups: groups.len(),
        failure,
    }
}

/// One independent sub-history: the ops on one keys vector, by call time.
pub(super) struct Group<'h> {
    pub(super) keys: &'h [String],
    pub(super) ops: Vec<GroupOp>,
    /// The distinct value vectors of the group; a register state is an index in here, and 0 is
    /// every key absent.
    pub(super) values: Vec<Vec<Option<String>>>,
}

/// An index into [`Group::values`].
pub(super) type State = u32;

/// A value vector no write produces: reads of it and compares against it never match.
const NEVER: State = u32::MAX;

#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Read(State),
    Put(State),
    Cas {
        expect: State,
        value: State,
        ok: Option<bool>,
    },
}

impl Step {
    /// The state after this op at state `s`, or None when the op cannot go here.
    ///
    /// An unanswered compare-and-set only goes where its compare holds: where it would fail it
    /// changes nothing, which is the same as leaving it out.
    pub(super) fn apply(self, s: State) -> Option<State> {
        match self {
            Step::Read(got) => (s == got).then_some(s),
            Step::Put(value) => Some(value),
            Step::Cas {
                expect,
                value,
                ok: Some(true) | None,
            } => (s == expect).then_some(value),
            Step::Cas {
                expect,
                ok: Some(false),
                ..
            } => (s != expect).then_some(s),
        }
    }

    /// The state a write sets.
    pub(super) fn written(self) -> Option<State> {
        match self {
            Step::Put(v) | Step::Cas { value: v, .. } => Some(v),
            Step::Read(_) => None,
        }
    }

    /// The state this op needs in order to go (a read, or a compare that may succeed).
    pub(super) fn looks_for(self) -> Option<State> {
        match self {
            Step::Read(s)
            | Step::Cas {
                expect: s,
                ok: Some(true) | None,
                ..
            } => (s != NEVER).then_some(s),
            _ => None,
        }
    }

    /// Whether the op leaves the state as it is wherever it can go.
    pub(super) fn changes_nothing(self) -> bool {
        matches!(
            self,
            Step::Read(_)
                | Step::Cas {
                    ok: Some(false),
                    ..
                }
        )
    }
}

pub(super) struct GroupOp {
    /// Index in the whole history.
    pub(super) index: usize,
    pub(super) call: u64,
    /// Answer time (never before `call`); None: no answer.
    pub(super) ret: Option<u64>,
    pub(super) step: Step,
}

fn group_ops(history: &[Op]) -> Result<Vec<Group<'_>>, String> {
    let mut index: HashMap<&[String], usize> = HashMap::new();
    let mut groups: Vec<Group<'_>> = Vec::new();
    let mut ids: Vec<HashMap<Vec<Option<String>>, State>> = Vec::new();
    // Writes first, so that reads and compares can be looked up by value.
    let mut group_of = Vec::with_capacity(history.len());
    for (i, op) in history.iter().enumerate() {
        let n = op.keys.len();
        let lens_ok = match &op.kind {
            Kind::Read { got } => got.len() == n,
            Kind::Put { values } => values.len() == n,
            Kind::Cas { expect, values, .. } => expect.len() == n && values.len() == n,
        };
        if !lens_ok {
            return Err(format!(
                "op #{i} is malformed: it names {n} keys but carries a different number of values"
            ));
        }
        let g = *index.entry(op.keys.as_slice()).or_insert_with(|| {
            groups.push(Group {
                keys: &op.keys,
                ops: Vec::new(),
                values: vec![vec![None; n]],
            });
            ids.push(HashMap::from([(vec![None; n], 0)]));
            groups.len() - 1
        });
        group_of.push(g);
        if let Kind::Put { values } | Kind::Cas { values, .. } = &op.kind {
            let v = some(values);
            if !ids[g].contains_key(&v) {
                ids[g].insert(v.clone(), groups[g].values.len() as State);
                groups[g].values.push(v);
            }
        }
    }
    for (i, op) in history.iter().enumerate() {
        if matches!(op.kind, Kind::Read { .. }) && op.ret.is_none() {
            continue;
        }
        let g = group_of[i];
        let id = |v: &[Option<String>]| ids[g].get(v).copied().unwrap_or(NEVER);
        let step = match &op.kind {
            Kind::Read { got } => Step::Read(id(got)),
            Kind::Put { values } => Step::Put(id(&some(values))),
            Kind::Cas { expect, values, ok } => Step::Cas {
                expect: id(expect),
                value: id(&some(values)),
                ok: *ok,
            },
        };
        groups[g].ops.push(GroupOp {
            index: i,
            call: op.call,
            ret: op.ret.map(|r| r.max(op.call)),
            step,
        });
    }
    for group in &mut groups {
        group.ops.sort_by_key(|o| (o.call, o.index));
    }
    // A group of unanswered reads only constrains nothing.
    groups.retain(|g| !g.ops.is_empty());
    Ok(groups)
}

pub(super) fn some(values: &[String]) -> Vec<Option<String>> {
    values.iter().cloned().map(Some).collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    // --- history builders ----------------------------------------------------------------

    pub(in crate::chaos::check) fn keys(k: &str) -> Vec<String> {
        k.split(',').map(str::to_string).collect()
    }

    fn opt(v: &str) -> Option<String> {
        (v != "-").then(|| v.to_string())
    }

    /// `got`/`expect` values separated by commas, "-" for absent.
    fn opts(vs: &str) -> Vec<Option<String>> {
        vs.split(',').map(opt).collect()
    }

    fn strs(vs: &str) -> Vec<String> {
        vs.split(',').map(str::to_string).collect()
    }

    fn read(client: usize, call: u64, ret: u64, k: &str, got: &str) -> Op {
        Op {
            client,
            call,
            ret: Some(ret),
            keys: keys(k),
            kind: Kind::Read { got: opts(got) },
        }
    }

    fn put(client: usize, call: u64, ret: Option<u64>, k: &str, v: &str) -> Op {
        Op {
            client,
            call,
            ret,
            keys: keys(k),
            kind: Kind::Put { values: strs(v) },
        }
    }

    fn cas(
        client: usize,
        call: u64,
        ret: Option<u64>,
        k: &str,
        expect: &str,
        v: &str,
        ok: Option<bool>,
    ) -> Op {
        Op {
            client,
            call,
            ret,
            keys: keys(k),
            kind: Kind::Cas {
                expect: opts(expect),
                values: strs(v),
                ok,
            },
        }
    }

    fn check(history: &[Op]) -> Verdict {
        linearizable(history, Duration::from_secs(20))
    }

    // --- linearizability: small histories ---------------------------------------------------

    #[test]
    fn register_histories() {
        let cases: Vec<(&str, Vec<Op>, bool)> = vec![
            ("empty", vec![], true),
            (
                "read of the initial absent key",
                vec![read(0, 0, 10, "x", "-")],
                true,
            ),
            (
                "read after a write",
                vec![put(0, 0, Some(10), "x", "1"), read(1, 20, 30, "x", "1")],
                true,
            ),
            (
                "stale read after a completed write",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, Some(30), "x", "2"),
                    read(1, 40, 50, "x", "1"),
                ],
                false,
            ),
            (
                "absent read after a completed write",
                vec![put(0, 0, Some(10), "x", "1"), read(1, 20, 30, "x", "-")],
                false,
            ),
            (
                "read concurrent with a write sees either",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, Some(40), "x", "2"),
                    read(1, 25, 30, "x", "1"),
                    read(2, 25, 35, "x", "2"),
                ],
                true,
            ),
            (
                "a read sees the new value, a later read the old one",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, Some(100), "x", "2"),
                    read(1, 25, 30, "x", "2"),
                    read(2, 40, 50, "x", "1"),
                ],
                false,
            ),
            (
                "touching intervals count as concurrent",
                vec![put(0, 0, Some(10), "x", "1"), read(1, 10, 20, "x", "-")],
                true,
            ),
            (
                "two concurrent writes read in either order by one reader",
                vec![
                    put(0, 0, Some(100), "x", "a"),
                    put(1, 0, Some(100), "x", "b"),
                    read(2, 10, 20, "x", "a"),
                    read(2, 30, 40, "x", "b"),
                ],
                true,
            ),
            (
                "two concurrent writes read in opposite orders",
                vec![
                    put(0, 0, Some(100), "x", "a"),
                    put(1, 0, Some(100), "x", "b"),
                    read(2, 10, 20, "x", "a"),
                    read(2, 30, 40, "x", "b"),
                    read(3, 10, 20, "x", "b"),
                    read(3, 30, 40, "x", "a"),
                ],
                false,
            ),
            (
                "cas from the current value",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, Some(30), "x", "1", "2", Some(true)),
                    read(2, 40, 50, "x", "2"),
                ],
                true,
            ),
            (
                "cas success that could not have happened",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, Some(30), "x", "-", "2", Some(true)),
                ],
                false,
            ),
            (
                "cas failure that must have succeeded",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, Some(30), "x", "1", "2", Some(false)),
                ],
                false,
            ),
            (
                "cas failure against an older value",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, Some(30), "x", "2"),
                    cas(1, 40, Some(50), "x", "1", "3", Some(false)),
                    read(1, 60, 70, "x", "2"),
                ],
                true,
            ),
            (
                "two cas from one value both succeed",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, Some(30), "x", "1", "2", Some(true)),
                    cas(2, 20, Some(30), "x", "1", "3", Some(true)),
                ],
                false,
            ),
            (
                "unknown put explains a later read",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, None, "x", "2"),
                    read(1, 100, 110, "x", "2"),
                ],
                true,
            ),
            (
                "unknown put that never happened",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, None, "x", "2"),
                    read(1, 100, 110, "x", "1"),
                    read(1, 120, 130, "x", "1"),
                ],
                true,
            ),
            (
                "unknown put seen and then unseen",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, None, "x", "2"),
                    read(1, 50, 60, "x", "2"),
                    read(1, 70, 80, "x", "1"),
                ],
                false,
            ),
            (
                "unknown put seen before it was called",
                vec![read(1, 0, 10, "x", "2"), put(0, 20, None, "x", "2")],
                false,
            ),
            (
                "unknown put takes effect long after a later write",
                vec![
                    put(0, 0, None, "x", "1"),
                    put(1, 10, Some(20), "x", "2"),
                    read(2, 30, 40, "x", "2"),
                    read(2, 50, 60, "x", "1"),
                ],
                true,
            ),
            (
                "unseen unknown put explains a failed cas",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(1, 15, None, "x", "9"),
                    cas(2, 20, Some(30), "x", "1", "2", Some(false)),
                ],
                true,
            ),
            (
                "unseen unknown put cannot explain a failed cas before its call",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(2, 20, Some(30), "x", "1", "2", Some(false)),
                    put(1, 40, None, "x", "9"),
                ],
                false,
            ),
            (
                "unknown cas that applied",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, None, "x", "1", "2", None),
                    read(2, 100, 110, "x", "2"),
                ],
                true,
            ),
            (
                "unknown cas whose compare could never hold",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    cas(1, 20, None, "x", "7", "2", None),
                    read(2, 100, 110, "x", "2"),
                ],
                false,
            ),
            (
                "unanswered reads are ignored",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    Op {
                        ret: None,
                        ..read(1, 20, 0, "x", "nonsense")
                    },
                ],
                true,
            ),
            (
                "multi-key cas moves both keys",
                vec![
                    cas(0, 0, Some(10), "a,b", "-,-", "x,x", Some(true)),
                    read(1, 20, 30, "a,b", "x,x"),
                    cas(0, 40, Some(50), "a,b", "x,x", "y,y", Some(true)),
                    read(1, 60, 70, "a,b", "y,y"),
                ],
                true,
            ),
            (
                "multi-key read of half a cas",
                vec![
                    cas(0, 0, Some(10), "a,b", "-,-", "x,x", Some(true)),
                    read(1, 5, 30, "a,b", "x,-"),
                ],
                false,
            ),
            (
                "multi-key cas against a stale pair fails",
                vec![
                    cas(0, 0, Some(10), "a,b", "-,-", "x,x", Some(true)),
                    cas(1, 20, Some(30), "a,b", "-,-", "y,y", Some(false)),
                    read(1, 40, 50, "a,b", "x,x"),
                ],
                true,
            ),
            (
                "multi-key cas that succeeded against a stale pair",
                vec![
                    cas(0, 0, Some(10), "a,b", "-,-", "x,x", Some(true)),
                    cas(1, 20, Some(30), "a,b", "-,-", "y,y", Some(true)),
                ],
                false,
            ),
            (
                "key groups are independent",
                vec![
                    put(0, 0, Some(10), "x", "1"),
                    put(0, 20, Some(30), "y", "1"),
                    read(1, 40, 50, "x", "1"),
                    read(1, 60, 70, "y", "1"),
                    read(1, 80, 90, "z", "-"),
                ],
                true,
            ),
        ];
        for (name, history, want) in cases {
            let v = check(&history);
            assert_eq!(v.linearizable, Some(want), "{name}: {v:?}");
            assert_eq!(v.failure.is_some(), !want, "{name}: {v:?}");
        }
    }

    #[test]
    fn counts_ops_and_groups() {
        let history = vec![
            put(0, 0, Some(10), "x", "1"),
            put(0, 20, Some(30), "a,b", "1,1"),
            read(1, 40, 50, "x", "1"),
            Op {
                ret: None,
                ..read(1, 60, 0, "y", "-")
            },
        ];
        let v = check(&history);
        assert_eq!(v.linearizable, Some(true));
        assert_eq!((v.ops, v.groups), (3, 2));
    }

    #[test]
    fn failure_names_the_group_and_the_stuck_op() {
        let history = vec![
            put(0, 0, Some(10), "x", "1"),
            put(0, 20, Some(30), "x", "2"),
            read(7, 40, 50, "x", "1"),
            put(0, 0, Some(10), "y", "1"),
        ];
        let v = check(&history);
        assert_eq!(v.linearizable, Some(false));
        let f = v.failure.unwrap_or_default();
        assert!(f.contains("keys [x]"), "{f}");
        assert!(f.contains("#2 (client 7: read x=1"), "{f}");
        assert!(f.contains("leaving x=2"), "{f}");
    }

    #[test]
    fn malformed_op_is_reported() {
        let mut op = put(0, 0, Some(10), "a,b", "1,1");
        op.keys.pop();
        let v = check(&[op]);
        assert_eq!(v.linearizable, Some(false));
        assert!(v.failure.unwrap_or_default().contains("malformed"));
    }

    /// Many concurrent writes and a read of a value never written: every order of the writes
    /// has to be ruled out.
    fn hard_history(writers: usize) -> Vec<Op> {
        let mut h: Vec<Op> = (0..writers)
            .map(|i| put(i, 0, Some(1000), "x", &format!("v{i}")))
            .collect();
        h.push(read(99, 2000, 2010, "x", "never"));
        h
    }

    #[test]
    fn budget_exceeded_is_unknown_not_true() {
        let v = linearizable(&hard_history(16), Duration::ZERO);
        assert_eq!(v.linearizable, None, "{v:?}");
        assert!(v.failure.unwrap_or_default().contains("gave up"));
    }

    #[test]
    fn exhaustive_search_finishes_with_a_verdict() {
        let v = check(&hard_history(10));
        assert_eq!(v.linearizable, Some(false), "{v:?}");
    }
}
