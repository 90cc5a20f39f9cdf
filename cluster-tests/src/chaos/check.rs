//! Checkers over what a campaign's clients saw, all pure functions of recorded histories:
//!
//! - [`linearizable`]: whether the register and transaction operations fit one sequential
//!   order that respects real time (Wing & Gong's search with Lowe's memo of linearized set and
//!   state, checked per group of keys, since linearizability is local);
//! - [`check_watches`]: etcd's watch guarantees (ordered, unique, reliable, atomic, resumable,
//!   bookmarkable) over every watcher's stream;
//! - [`revisions_monotonic`]: header revisions never go back for one observer;
//! - [`lost_writes`]: acknowledged writes missing at the end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

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
struct Group<'h> {
    keys: &'h [String],
    ops: Vec<GroupOp>,
    /// The distinct value vectors of the group; a register state is an index in here, and 0 is
    /// every key absent.
    values: Vec<Vec<Option<String>>>,
}

/// An index into [`Group::values`].
type State = u32;

/// A value vector no write produces: reads of it and compares against it never match.
const NEVER: State = u32::MAX;

#[derive(Debug, Clone, Copy)]
enum Step {
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
    fn apply(self, s: State) -> Option<State> {
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
    fn written(self) -> Option<State> {
        match self {
            Step::Put(v) | Step::Cas { value: v, .. } => Some(v),
            Step::Read(_) => None,
        }
    }

    /// The state this op needs in order to go (a read, or a compare that may succeed).
    fn looks_for(self) -> Option<State> {
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
    fn changes_nothing(self) -> bool {
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

struct GroupOp {
    /// Index in the whole history.
    index: usize,
    call: u64,
    /// Answer time (never before `call`); None: no answer.
    ret: Option<u64>,
    step: Step,
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

enum Outcome {
    Linearizable,
    Not(String),
    GaveUp,
}

/// A set of op numbers kept so that its memo key stays short: the search linearizes ops
/// roughly in call order, so the set is a run of all-ones words followed by a few words of
/// scattered bits.
struct Bits {
    words: Vec<u64>,
    /// Every word before this one is all ones.
    full: usize,
}

impl Bits {
    fn new(n: usize) -> Self {
        Self {
            words: vec![0; n.div_ceil(64)],
            full: 0,
        }
    }

    fn set(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
        while self.full < self.words.len() && self.words[self.full] == u64::MAX {
            self.full += 1;
        }
    }

    fn clear(&mut self, i: usize) {
        self.words[i / 64] &= !(1 << (i % 64));
        self.full = self.full.min(i / 64);
    }

    /// The words from `from` on, without trailing zero words.
    fn tail(&self, from: usize) -> &[u64] {
        let mut end = self.words.len();
        while end > from && self.words[end - 1] == 0 {
            end -= 1;
        }
        &self.words[from.min(end)..end]
    }
}

/// Whether every bit of `a` is in `b`.
fn subset(a: &[u64], b: &[u64]) -> bool {
    a.iter()
        .enumerate()
        .all(|(i, w)| w & !b.get(i).copied().unwrap_or(0) == 0)
}

/// A small multiplicative hasher for the memo's word-slice keys (the default SipHash costs
/// more than the rest of a search step).
#[derive(Default)]
struct WordHasher(u64);

impl Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type Memo = HashMap<Box<[u64]>, Vec<Box<[u64]>>, BuildHasherDefault<WordHasher>>;

/// No entry: the end of the entry list.
const NIL: u32 = u32::MAX;

/// The search over one group.
///
/// The group's calls and answers form a doubly linked list in time order (calls before
/// answers at equal times, so touching ops count as concurrent; unanswered ops have a call
/// only). The ops that may be linearized next are those whose call comes before the first
/// answer still in the list; linearizing one takes its entries out of the list, and
/// backtracking puts them back. All answered ops linearized is success: what is still open
/// had no answer and may take effect at the very end, or never.
///
/// # Correctness
///
/// Three cuts keep the search small, each safe because it only drops orders that another order
/// the search does try can stand in for:
///
/// - The memo maps (answered ops linearized, state) to the sets of unanswered ops linearized
///   with them that were already explored. A node is skipped when an explored node has the
///   same answered set and state and a subset of its unanswered ops: an unanswered op can
///   always be left for later, so the explored node could do everything this one can.
/// - An op that changes nothing (a read, a failed compare) and fits the current state goes
///   now, alone: any order that places it later can place it here instead, as its call came
///   before every open answer and the states in between stay the same.
/// - An unanswered write whose state no open op reads or compares against may only go where
///   a failed compare expects the current state (see [`Search::compare_needs_change`]).
struct Search<'g, 'h> {
    history: &'h [Op],
    group: &'g Group<'h>,
    /// Per op: its number among answered ops, or among unanswered ones.
    number: Vec<usize>,
    call_entry: Vec<u32>,
    ret_entry: Vec<u32>,
    /// Per entry: its op, and whether it is the answer.
    entry_op: Vec<u32>,
    entry_ret: Vec<bool>,
    next: Vec<u32>,
    prev: Vec<u32>,
    head: u32,
    answered: Bits,
    unanswered: Bits,
    answered_total: usize,
    answered_left: usize,
    /// Per state: the ops not yet linearized that read it or compare against it.
    readers_left: Vec<u32>,
    memo: Memo,
}

/// The deepest point the search reached, for the report.
struct Stuck {
    linearized: usize,
    state: State,
    blocked: u32,
    open: Vec<u32>,
}

struct Frame {
    candidates: Vec<u32>,
    tried: usize,
    /// Whether a failed compare among the candidates needs the state to change first.
    compare_needs_change: bool,
    op: u32,
    state: State,
}

impl<'g, 'h> Search<'g, 'h> {
    fn new(history: &'h [Op], group: &'g Group<'h>) -> Self {
        let ops = &group.ops;
        let mut number = Vec::with_capacity(ops.len());
        let (mut answered, mut unanswered) = (0, 0);
        let mut entries: Vec<(u64, bool, u32)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            entries.push((op.call, false, i as u32));
            if let Some(ret) = op.ret {
                entries.push((ret, true, i as u32));
                number.push(answered);
                answered += 1;
            } else {
                number.push(unanswered);
                unanswered += 1;
            }
        }
        entries.sort_unstable();
        let n = entries.len() as u32;
        let mut call_entry = vec![NIL; ops.len()];
        let mut ret_entry = vec![NIL; ops.len()];
        for (e, &(_, is_ret, op)) in entries.iter().enumerate() {
            if is_ret {
                ret_entry[op as usize] = e as u32;
            } else {
                call_entry[op as usize] = e as u32;
            }
        }
        // Entry `n` is the list's head (and tail) sentinel.
        let next = (0..=n).map(|e| if e == n { 0 } else { e + 1 }).collect();
        let prev = (0..=n).map(|e| if e == 0 { n } else { e - 1 }).collect();
        Self {
            history,
            group,
            number,
            call_entry,
            ret_entry,
            entry_op: entries.iter().map(|e| e.2).collect(),
            entry_ret: entries.iter().map(|e| e.1).collect(),
            next,
            prev,
            head: n,
            answered: Bits::new(answered),
            unanswered: Bits::new(unanswered),
            answered_total: answered,
            answered_left: answered,
            readers_left: {
                let mut r = vec![0; group.values.len()];
                for op in ops {
                    if let Some(s) = op.step.looks_for() {
                        r[s as usize] += 1;
                    }
                }
                r
            },
            memo: Memo::default(),
        }
    }

    /// Fills `out` with the ops that may go next, answered ones first (an unanswered op can
    /// always wait), and returns the op of the first answer in the list, if any.
    fn candidates(&self, out: &mut Vec<u32>) -> Option<u32> {
        out.clear();
        let mut later = Vec::new();
        let mut e = self.next[self.head as usize];
        let mut blocked = None;
        while e != self.head {
            let op = self.entry_op[e as usize];
            if self.entry_ret[e as usize] {
                blocked = Some(op);
                break;
            }
            if self.group.ops[op as usize].ret.is_some() {
                out.push(op);
            } else {
                later.push(op);
            }
            e = self.next[e as usize];
        }
        out.extend(later);
        blocked
    }

    fn unlink(&mut self, e: u32) {
        let (p, n) = (self.prev[e as usize], self.next[e as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
    }

    fn relink(&mut self, e: u32) {
        let (p, n) = (self.prev[e as usize], self.next[e as usize]);
        self.next[p as usize] = e;
        self.prev[n as usize] = e;
    }

    fn mark(&mut self, op: u32) {
        if let Some(s) = self.group.ops[op as usize].step.looks_for() {
            self.readers_left[s as usize] -= 1;
        }
        let i = self.number[op as usize];
        if self.group.ops[op as usize].ret.is_some() {
            self.answered.set(i);
            self.answered_left -= 1;
        } else {
            self.unanswered.set(i);
        }
    }

    fn unmark(&mut self, op: u32) {
        if let Some(s) = self.group.ops[op as usize].step.looks_for() {
            self.readers_left[s as usize] += 1;
        }
        let i = self.number[op as usize];
        if self.group.ops[op as usize].ret.is_some() {
            self.answered.clear(i);
            self.answered_left += 1;
        } else {
            self.unanswered.clear(i);
        }
    }

    fn lift(&mut self, op: u32) {
        self.unlink(self.call_entry[op as usize]);
        if self.ret_entry[op as usize] != NIL {
            self.unlink(self.ret_entry[op as usize]);
        }
    }

    fn unlift(&mut self, op: u32) {
        if self.ret_entry[op as usize] != NIL {
            self.relink(self.ret_entry[op as usize]);
        }
        self.relink(self.call_entry[op as usize]);
    }

    /// Records the current node in the memo; false if it or a node that covers it was
    /// explored already.
    fn first_visit(&mut self, state: State) -> bool {
        let full = self.answered.full;
        let mut key = Vec::with_capacity(1 + self.answered.words.len() - full);
        key.push(((full as u64) << 32) | state as u64);
        key.extend_from_slice(self.answered.tail(full));
        let unanswered = self.unanswered.tail(0);
        let seen = self.memo.entry(key.into_boxed_slice()).or_default();
        if seen.iter().any(|s| subset(s, unanswered)) {
            return false;
        }
        seen.push(unanswered.into());
        true
    }

    /// Prepares a node: its candidates, cut to a single op that changes nothing if one fits,
    /// and whether unread unanswered writes may go. None: every answered op is linearized.
    fn expand(&self, candidates: &mut Vec<u32>, state: State) -> Option<bool> {
        self.candidates(candidates)?;
        let ops = &self.group.ops;
        if let Some(&c) = candidates.iter().find(|&&c| {
            let step = ops[c as usize].step;
            step.changes_nothing() && step.apply(state).is_some()
        }) {
            candidates.clear();
            candidates.push(c);
            return Some(false);
        }
        Some(self.compare_needs_change(candidates, state))
    }

    /// Whether unanswered write `op` may go at a node.
    fn may_write(&self, op: &GroupOp, needs: bool) -> bool {
        match (op.ret, op.step.written()) {
            (None, Some(v)) => needs || self.readers_left[v as usize] > 0,
            _ => true,
        }
    }

    /// Whether a failed compare among `candidates` expects exactly `state`: only then may an
    /// unanswered write that no open op reads go now. In any order that uses such a write, the
    /// ops right after it are failed compares until the next write (nothing else can follow a
    /// state nobody reads), so it can be moved later, past every compare that fails anyway, and
    /// dropped when it reaches the next write (a put, since a compare cannot expect it).
    fn compare_needs_change(&self, candidates: &[u32], state: State) -> bool {
        candidates.iter().any(|&c| {
            matches!(
                self.group.ops[c as usize].step,
                Step::Cas { expect, ok: Some(false), .. } if expect == state
            )
        })
    }

    fn run(mut self, deadline: Instant) -> Outcome {
        let mut state: State = 0;
        let mut stack: Vec<Frame> = Vec::new();
        let mut spare: Vec<Vec<u32>> = Vec::new();
        let mut candidates = Vec::new();
        let Some(mut needs) = self.expand(&mut candidates, state) else {
            return Outcome::Linearizable;
        };
        let mut tried = 0;
        let mut stuck: Option<Stuck> = None;
        let mut steps: u64 = 0;
        loop {
            steps += 1;
            if steps.is_multiple_of(256) && Instant::now() >= deadline {
                return Outcome::GaveUp;
            }
            let mut descended = false;
            while tried < candidates.len() {
                let op = candidates[tried];
                tried += 1;
                let gop = &self.group.ops[op as usize];
                if !self.may_write(gop, needs) {
                    continue;
                }
                let Some(after) = gop.step.apply(state) else {
                    continue;
                };
                self.mark(op);
                if !self.first_visit(after) {
                    self.unmark(op);
                    continue;
                }
                self.lift(op);
                let next = spare.pop().unwrap_or_default();
                stack.push(Frame {
                    candidates: std::mem::replace(&mut candidates, next),
                    tried,
                    compare_needs_change: needs,
                    op,
                    state,
                });
                state = after;
                match self.expand(&mut candidates, state) {
                    Some(n) if self.answered_left > 0 => needs = n,
                    _ => return Outcome::Linearizable,
                }
                tried = 0;
                descended = true;
                break;
            }
            if descended {
                continue;
            }
            let done = self.answered_total - self.answered_left;
            if stuck.as_ref().is_none_or(|s| done > s.linearized) {
                let mut open = Vec::new();
                if let Some(blocked) = self.candidates(&mut open) {
                    stuck = Some(Stuck {
                        linearized: done,
                        state,
                        blocked,
                        open,
                    });
                }
            }
            let Some(frame) = stack.pop() else {
                return Outcome::Not(self.explain(stuck));
            };
            self.unlift(frame.op);
            self.unmark(frame.op);
            spare.push(std::mem::replace(&mut candidates, frame.candidates));
            tried = frame.tried;
            needs = frame.compare_needs_change;
            state = frame.state;
        }
    }

    fn explain(&self, stuck: Option<Stuck>) -> String {
        let keys = format!("[{}]", self.group.keys.join(", "));
        let answered = self.answered_total;
        let Some(s) = stuck else {
            return format!("keys {keys}: no order of its {answered} answered ops fits");
        };
        let mut out = format!(
            "keys {keys}: no order of its {answered} answered ops fits what the clients saw; at \
             best {} line up, leaving {}, and then {} cannot be placed",
            s.linearized,
            self.describe_state(s.state),
            self.describe_op(s.blocked),
        );
        let open: Vec<String> = s
            .open
            .iter()
            .filter(|&&o| o != s.blocked)
            .take(6)
            .map(|&o| self.describe_op(o))
            .collect();
        if !open.is_empty() {
            out += &format!("; open then: {}", open.join("; "));
            if s.open.len() > open.len() + 1 {
                out += "; ...";
            }
        }
        out
    }

    fn describe_state(&self, s: State) -> String {
        assignments(self.group.keys, &self.group.values[s as usize])
    }

    fn describe_op(&self, op: u32) -> String {
        let gop = &self.group.ops[op as usize];
        let h = &self.history[gop.index];
        let keys = &h.keys;
        let what = match &h.kind {
            Kind::Read { got } => format!("read {}", assignments(keys, got)),
            Kind::Put { values } => format!("put {}", assignments(keys, &some(values))),
            Kind::Cas { expect, values, ok } => format!(
                "cas {} -> {} ({})",
                assignments(keys, expect),
                values.join(" "),
                match ok {
                    Some(true) => "applied",
                    Some(false) => "compare failed",
                    None => "no answer",
                }
            ),
        };
        format!(
            "#{} (client {}: {what}, {}-{})",
            gop.index,
            h.client,
            seconds(gop.call),
            gop.ret.map_or_else(|| "no answer".to_string(), seconds)
        )
    }
}

fn some(values: &[String]) -> Vec<Option<String>> {
    values.iter().cloned().map(Some).collect()
}

/// `k=v` pairs, `k absent` for missing keys.
fn assignments(keys: &[String], values: &[Option<String>]) -> String {
    keys.iter()
        .zip(values)
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("{k} absent"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Nanoseconds since the campaign began, as seconds.
fn seconds(ns: u64) -> String {
    format!("{}.{:09} s", ns / 1_000_000_000, ns % 1_000_000_000)
}

// ---------------------------------------------------------------------------------------------
// Watches
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The kv's mod_revision, or the deletion's revision.
    pub revision: i64,
    pub key: String,
    pub put: bool,
    pub value: String,
}

/// One watch stream as a watcher saw it, response by response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchLog {
    pub watcher: usize,
    /// Key range watched: [start, end) with etcd semantics (end empty = single key `start`;
    /// end "\0" = all keys >= start).
    pub start: String,
    pub end: String,
    pub responses: Vec<WatchResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchResponse {
    /// A response with events (header revision included).
    Events { header: i64, events: Vec<Event> },
    /// A progress notification (no events): the watcher has seen everything up to `header`.
    Progress { header: i64 },
    /// The stream (re)started from `from` (the first one at creation; later ones are resumes
    /// after a broken stream, normally from last seen revision + 1). `from` <= 0 is etcd's
    /// "from the current revision".
    Started { from: i64 },
    /// The start revision was compacted (etcd's compact_revision): events before
    /// `compact_revision` are gone.
    Compacted { compact_revision: i64 },
}

/// The outcome of [`check_watches`]: each guarantee held for every watcher, or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchReport {
    pub watchers: usize,
    /// Events delivered, over all watchers.
    pub events: usize,
    pub ordered: bool,
    pub unique: bool,
    pub reliable: bool,
    pub atomic: bool,
    pub resumable: bool,
    pub bookmarkable: bool,
    /// The first few violations, human readable.
    pub problems: Vec<String>,
}

/// How many violations a report spells out.
const MAX_PROBLEMS: usize = 20;

#[derive(Debug, Clone, Copy)]
enum Guarantee {
    Ordered,
    Unique,
    Reliable,
    Atomic,
    Resumable,
    Bookmarkable,
}

impl WatchReport {
    fn violated(&mut self, g: Guarantee, problem: String) {
        let flag = match g {
            Guarantee::Ordered => &mut self.ordered,
            Guarantee::Unique => &mut self.unique,
            Guarantee::Reliable => &mut self.reliable,
            Guarantee::Atomic => &mut self.atomic,
            Guarantee::Resumable => &mut self.resumable,
            Guarantee::Bookmarkable => &mut self.bookmarkable,
        };
        *flag = false;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(problem);
        }
    }
}

/// Whether `key` is in the watched range, with etcd's meaning of `end`.
fn in_range(key: &str, start: &str, end: &str) -> bool {
    match end {
        "" => key == start,
        "\0" => key >= start,
        _ => key >= start && key < end,
    }
}

fn describe_event(e: &Event) -> String {
    if e.put {
        format!("put {}={} at {}", e.key, e.value, e.revision)
    } else {
        format!("delete {} at {}", e.key, e.revision)
    }
}

/// Whether two events of one key and revision say the same (a deletion carries no value).
fn same_event(a: &Event, b: &Event) -> bool {
    a.put == b.put && (!a.put || a.value == b.value)
}

/// Checks etcd's watch guarantees over every watcher's log, against `truth` (every event of the
/// store, authoritative) when given, else against the union of what all watchers saw:
///
/// - ordered: a watcher's event revisions never decrease, across resumes too;
/// - unique: no (key, revision) reaches a watcher twice;
/// - reliable: no gaps: every event in a watcher's range within the revisions it covered was
///   delivered, and (with `truth`) as it happened; an event outside the range is a problem too;
/// - atomic: the events of one revision come in one response, and (with `truth`) a response
///   with any event of a revision has all of that revision's events in the range;
/// - resumable: a stream resumed from `from` delivers nothing before `from`, and `from` skips
///   nothing the watcher had not seen (or was told was compacted);
/// - bookmarkable: after a progress notification at `h`, no event at or below `h` arrives.
///
/// A stream covers the revisions from its start (raised to a compaction it was told about)
/// up to its highest progress notification or event. The header of a response with events is
/// not counted as covered: etcd sends a watcher that is catching up its history in batches
/// under the store's current revision, so a stream that broke mid-catch-up would look like
/// it had lost the rest of the batch.
pub fn check_watches(logs: &[WatchLog], truth: Option<&[Event]>) -> WatchReport {
    let mut report = WatchReport {
        watchers: logs.len(),
        events: 0,
        ordered: true,
        unique: true,
        reliable: true,
        atomic: true,
        resumable: true,
        bookmarkable: true,
        problems: Vec::new(),
    };
    // The reference history: (key, revision) to event, and the keys of each revision.
    let mut reference: HashMap<(&str, i64), &Event> = HashMap::new();
    match truth {
        Some(truth) => {
            for e in truth {
                reference.entry((e.key.as_str(), e.revision)).or_insert(e);
            }
        }
        None => {
            for log in logs {
                for e in delivered(log) {
                    let known = *reference.entry((e.key.as_str(), e.revision)).or_insert(e);
                    if !same_event(known, e) {
                        report.violated(
                            Guarantee::Reliable,
                            format!(
                                "watcher {} got {}, another watcher got {}",
                                log.watcher,
                                describe_event(e),
                                describe_event(known)
                            ),
                        );
                    }
                }
            }
        }
    }
    let mut by_revision: BTreeMap<i64, Vec<&Event>> = BTreeMap::new();
    for e in reference.values() {
        by_revision.entry(e.revision).or_default().push(e);
    }
    for log in logs {
        check_watch_log(log, truth.is_some(), &reference, &by_revision, &mut report);
    }
    report
}

fn delivered(log: &WatchLog) -> impl Iterator<Item = &Event> {
    log.responses.iter().flat_map(|r| match r {
        WatchResponse::Events { events, .. } => events.as_slice(),
        _ => &[],
    })
}

/// One stream of a watch log: from a Started to the next.
struct Stream {
    from: i64,
    /// The first revision covered; None until known (a stream from the current revision
    /// covers from its first event or progress notification on).
    start: Option<i64>,
    /// The last revision covered.
    end: Option<i64>,
    /// Whether an event came on this stream yet.
    any_event: bool,
}

impl Stream {
    fn new(from: i64) -> Self {
        Self {
            from,
            start: (from > 0).then_some(from),
            end: None,
            any_event: false,
        }
    }

    fn covered(&self) -> Option<(i64, i64)> {
        match (self.start, self.end) {
            (Some(s), Some(e)) if s <= e => Some((s, e)),
            _ => None,
        }
    }
}

fn check_watch_log(
    log: &WatchLog,
    with_truth: bool,
    reference: &HashMap<(&str, i64), &Event>,
    by_revision: &BTreeMap<i64, Vec<&Event>>,
    report: &mut WatchReport,
) {
    let w = log.watcher;
    let in_log_range = |key: &str| in_range(key, &log.start, &log.end);
    // (key, revision) delivered, with the response that brought it.
    let mut seen: HashMap<(&str, i64), usize> = HashMap::new();
    // The first response that brought each revision.
    let mut revision_response: HashMap<i64, usize> = HashMap::new();
    let mut last: Option<&Event> = None;
    let mut progress: Option<i64> = None;
    let mut compacted: Option<i64> = None;
    let mut covered: Vec<(i64, i64)> = Vec::new();
    let mut stream: Option<Stream> = None;
    let mut first_from: Option<i64> = None;
    for (r, response) in log.responses.iter().enumerate() {
        match response {
            WatchResponse::Started { from } => {
                if let Some(s) = stream.take() {
                    covered.extend(s.covered());
                }
                if let Some(first) = first_from {
                    // Everything up to here was seen: events, progress, or before the first start.
                    let seen_upto = last
                        .map(|e| e.revision)
                        .into_iter()
                        .chain(progress)
                        .chain((first > 0).then_some(first - 1))
                        .max();
                    let allowed = seen_upto.map(|s| s + 1).max(compacted);
                    if *from <= 0 {
                        report.violated(
                            Guarantee::Resumable,
                            format!(
                                "watcher {w}: resumed from the current revision instead of after \
                                 the last revision it had seen{}",
                                seen_upto.map(|s| format!(" ({s})")).unwrap_or_default()
                            ),
                        );
                    } else if allowed.is_some_and(|a| *from > a) {
                        report.violated(
                            Guarantee::Resumable,
                            format!(
                                "watcher {w}: resumed from {from} though it had seen only up to {}",
                                seen_upto.map_or("nothing".to_string(), |s| s.to_string())
                            ),
                        );
                    }
                } else {
                    first_from = Some(*from);
                }
                stream = Some(Stream::new(*from));
            }
            WatchResponse::Compacted { compact_revision } => {
                compacted = compacted.max(Some(*compact_revision));
                if let Some(s) = stream.as_mut() {
                    s.start = s.start.max(Some(*compact_revision));
                }
            }
            WatchResponse::Progress { header } => {
                let s = stream.get_or_insert_with(|| Stream::new(0));
                if s.start.is_none() {
                    s.start = Some(header + 1);
                }
                s.end = s.end.max(Some(*header));
                progress = progress.max(Some(*header));
            }
            WatchResponse::Events { events, .. } => {
                let s = stream.get_or_insert_with(|| Stream::new(0));
                for e in events {
                    report.events += 1;
                    if !s.any_event && s.from > 0 && e.revision < s.from {
                        report.violated(
                            Guarantee::Resumable,
                            format!(
                                "watcher {w}: a stream started from {} began with {}",
                                s.from,
                                describe_event(e)
                            ),
                        );
                    }
                    s.any_event = true;
                    if s.start.is_none() {
                        s.start = Some(e.revision);
                    }
                    s.end = s.end.max(Some(e.revision));
                    if !in_log_range(&e.key) {
                        report.violated(
                            Guarantee::Reliable,
                            format!(
                                "watcher {w}: got {}, outside its range [{:?}, {:?})",
                                describe_event(e),
                                log.start,
                                log.end
                            ),
                        );
                    }
                    if let Some(prev) = last.filter(|p| e.revision < p.revision) {
                        report.violated(
                            Guarantee::Ordered,
                            format!(
                                "watcher {w}: got {} after {}",
                                describe_event(e),
                                describe_event(prev)
                            ),
                        );
                    }
                    if let Some(h) = progress.filter(|&h| e.revision <= h) {
                        report.violated(
                            Guarantee::Bookmarkable,
                            format!(
                                "watcher {w}: got {} after a progress notification at {h}",
                                describe_event(e)
                            ),
                        );
                    }
                    if seen.insert((e.key.as_str(), e.revision), r).is_some() {
                        report.violated(
                            Guarantee::Unique,
                            format!("watcher {w}: got {} twice", describe_event(e)),
                        );
                    } else if let Some(&first) = revision_response.get(&e.revision) {
                        if first != r {
                            report.violated(
                                Guarantee::Atomic,
                                format!(
                                    "watcher {w}: revision {} came split over responses {first} \
                                     and {r} ({} in the second)",
                                    e.revision,
                                    describe_event(e)
                                ),
                            );
                        }
                    }
                    revision_response.entry(e.revision).or_insert(r);
                    if with_truth {
                        match reference.get(&(e.key.as_str(), e.revision)) {
                            None => report.violated(
                                Guarantee::Reliable,
                                format!(
                                    "watcher {w}: got {}, which never happened",
                                    describe_event(e)
                                ),
                            ),
                            Some(t) if !same_event(t, e) => report.violated(
                                Guarantee::Reliable,
                                format!(
                                    "watcher {w}: got {} where the store had {}",
                                    describe_event(e),
                                    describe_event(t)
                                ),
                            ),
                            Some(_) => {}
                        }
                    }
                    if last.is_none_or(|p| e.revision >= p.revision) {
                        last = Some(e);
                    }
                }
                if with_truth {
                    check_response_atomic(w, r, events, &in_log_range, by_revision, report);
                }
            }
        }
    }
    if let Some(s) = stream.take() {
        covered.extend(s.covered());
    }
    // Every reference event in range within the covered revisions was delivered.
    covered.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (s, e) in covered {
        match merged.last_mut() {
            Some(m) if s <= m.1.saturating_add(1) => m.1 = m.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    for &(s, e) in &merged {
        for events in by_revision.range(s..=e).map(|(_, v)| v) {
            for ev in events {
                if in_log_range(&ev.key) && !seen.contains_key(&(ev.key.as_str(), ev.revision)) {
                    report.violated(
                        Guarantee::Reliable,
                        format!(
                            "watcher {w}: never got {}, though it covered revisions {s}..={e}",
                            describe_event(ev)
                        ),
                    );
                }
            }
        }
    }
}

/// With the truth: every revision in response `r` comes with all of its events in range.
fn check_response_atomic(
    w: usize,
    r: usize,
    events: &[Event],
    in_log_range: &dyn Fn(&str) -> bool,
    by_revision: &BTreeMap<i64, Vec<&Event>>,
    report: &mut WatchReport,
) {
    let mut revisions: Vec<i64> = events.iter().map(|e| e.revision).collect();
    revisions.sort_unstable();
    revisions.dedup();
    for rev in revisions {
        let Some(all) = by_revision.get(&rev) else {
            continue;
        };
        for t in all.iter().filter(|t| in_log_range(&t.key)) {
            if !events.iter().any(|e| e.revision == rev && e.key == t.key) {
                report.violated(
                    Guarantee::Atomic,
                    format!(
                        "watcher {w}: response {r} had revision {rev} without {}",
                        describe_event(t)
                    ),
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Revisions and lost writes
// ---------------------------------------------------------------------------------------------

/// (client or member label, observation time ns, header revision)
///
/// Per label, the revisions in time order never decrease (observations at the same time keep
/// their recorded order). The error names the label, both times and both revisions of the
/// earliest regression, and how many there were.
pub fn revisions_monotonic(observations: &[(String, u64, i64)]) -> Result<(), String> {
    let mut by_label: BTreeMap<&str, Vec<(u64, i64)>> = BTreeMap::new();
    for (label, at, revision) in observations {
        by_label.entry(label).or_default().push((*at, *revision));
    }
    let mut regressions: Vec<(u64, String)> = Vec::new();
    for (label, mut seen) in by_label {
        seen.sort_by_key(|&(at, _)| at);
        for pair in seen.windows(2) {
            let ((t1, r1), (t2, r2)) = (pair[0], pair[1]);
            if r2 < r1 {
                regressions.push((
                    t2,
                    format!(
                        "{label} saw revision {r1} at {} and then revision {r2} at {}",
                        seconds(t1),
                        seconds(t2)
                    ),
                ));
            }
        }
    }
    regressions.sort_by_key(|(at, _)| *at);
    match regressions.len() {
        0 => Ok(()),
        1 => Err(regressions.swap_remove(0).1),
        n => Err(format!(
            "{} ({} regressions in all)",
            regressions.swap_remove(0).1,
            n
        )),
    }
}

/// Acknowledged unique keys written and the keys found at the end: the acknowledged ones
/// missing, in acknowledgement order, each once.
pub fn lost_writes(acknowledged: &[String], found: &HashSet<String>) -> Vec<String> {
    let mut reported = HashSet::new();
    acknowledged
        .iter()
        .filter(|k| !found.contains(*k) && reported.insert(k.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- history builders ----------------------------------------------------------------

    fn keys(k: &str) -> Vec<String> {
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

    // --- linearizability: simulated histories -----------------------------------------------

    /// splitmix64: a small deterministic generator for the simulations.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn chance(&mut self, p: f64) -> bool {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
        }
    }

    /// A linearizable history: `clients` sequential clients issue `ops` operations over
    /// `groups`, each taking effect at a random point inside its interval (unanswered ones at a
    /// random point or never), so intervals overlap at random. A client whose op went
    /// unanswered continues as a new client.
    fn simulate(seed: u64, clients: usize, ops: usize, groups: &[&str], unknown: f64) -> Vec<Op> {
        let mut rng = Rng(seed);
        struct Planned {
            client: usize,
            call: u64,
            effect: u64,
            ret: Option<u64>,
            applies: bool,
            group: usize,
            pick: u64,
        }
        let mut clock = vec![0u64; clients];
        let mut name: Vec<usize> = (0..clients).collect();
        let mut plan = Vec::with_capacity(ops);
        for _ in 0..ops {
            let c = rng.below(clients as u64) as usize;
            let call = clock[c] + rng.below(20);
            let took = 1 + rng.below(100);
            let effect = call + rng.below(took + 1);
            let answered = !rng.chance(unknown);
            plan.push(Planned {
                client: name[c],
                call,
                effect,
                ret: answered.then_some(call + took),
                applies: answered || rng.chance(0.5),
                group: rng.below(groups.len() as u64) as usize,
                pick: rng.below(100),
            });
            clock[c] = call + took;
            if !answered {
                name[c] += 1000;
            }
        }
        let mut order: Vec<usize> = (0..plan.len()).collect();
        order.sort_by_key(|&i| (plan[i].effect, i));
        let width = |g: usize| groups[g].split(',').count();
        let mut state: Vec<Vec<Option<String>>> =
            (0..groups.len()).map(|g| vec![None; width(g)]).collect();
        let mut last_seen: HashMap<(usize, usize), Vec<Option<String>>> = HashMap::new();
        let mut history: Vec<Option<Op>> = (0..plan.len()).map(|_| None).collect();
        for i in order {
            let p = &plan[i];
            let g = p.group;
            let value = vec![format!("v{i}"); width(g)];
            let kind = if p.pick < 40 {
                if p.ret.is_none() {
                    continue;
                }
                last_seen.insert((p.client, g), state[g].clone());
                Kind::Read {
                    got: state[g].clone(),
                }
            } else if p.pick < 70 {
                if p.applies {
                    state[g] = some(&value);
                }
                Kind::Put { values: value }
            } else {
                let expect = last_seen
                    .get(&(p.client, g))
                    .cloned()
                    .unwrap_or_else(|| vec![None; width(g)]);
                let holds = state[g] == expect;
                if holds && p.applies {
                    state[g] = some(&value);
                }
                Kind::Cas {
                    expect,
                    values: value,
                    ok: p.ret.map(|_| holds),
                }
            };
            history[i] = Some(Op {
                client: p.client,
                call: p.call,
                ret: p.ret,
                keys: keys(groups[g]),
                kind,
            });
        }
        history.into_iter().flatten().collect()
    }

    #[test]
    fn simulated_history_is_linearizable() {
        let history = simulate(7, 5, 2000, &["x"], 0.03);
        assert!(history.len() > 1900);
        assert!(history.iter().any(|o| o.ret.is_none()));
        assert!(history.iter().any(|o| matches!(
            o.kind,
            Kind::Cas {
                ok: Some(false),
                ..
            }
        )));
        let v = linearizable(&history, Duration::from_secs(60));
        assert_eq!(v.linearizable, Some(true), "{v:?}");
    }

    #[test]
    fn simulated_histories_over_many_groups_are_linearizable() {
        let groups: Vec<String> = (0..50)
            .map(|i| format!("k{i}"))
            .chain((0..5).map(|i| format!("t{i}a,t{i}b")))
            .collect();
        let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
        for seed in 1..4 {
            let history = simulate(seed, 10, 20_000, &groups, 0.02);
            let v = linearizable(&history, Duration::from_secs(60));
            assert_eq!(v.linearizable, Some(true), "seed {seed}: {v:?}");
            assert_eq!(v.groups, groups.len());
        }
    }

    #[test]
    fn simulated_history_with_a_bad_read_is_not_linearizable() {
        let mut history = simulate(11, 5, 2000, &["x"], 0.03);
        let late = history
            .iter()
            .rposition(|o| matches!(o.kind, Kind::Read { .. }) && o.call > 0)
            .unwrap_or(0);
        history[late].kind = Kind::Read {
            got: vec![Some("never written".into())],
        };
        let v = linearizable(&history, Duration::from_secs(60));
        assert_eq!(v.linearizable, Some(false), "{v:?}");
        let f = v.failure.unwrap_or_default();
        assert!(f.contains(&format!("#{late} ")), "{f}");
    }

    #[test]
    fn simulated_history_with_a_stale_read_is_not_linearizable() {
        // A read that returns the value before the last write that completed before it.
        let mut history = simulate(5, 5, 2000, &["x"], 0.0);
        let mut writes: Vec<(u64, u64, String)> = history
            .iter()
            .filter_map(|o| match &o.kind {
                Kind::Put { values } => Some((o.call, o.ret?, values[0].clone())),
                Kind::Cas {
                    values,
                    ok: Some(true),
                    ..
                } => Some((o.call, o.ret?, values[0].clone())),
                _ => None,
            })
            .collect();
        writes.sort();
        // Two writes in real-time order, and a read after both.
        let (a, b) = writes
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                let b = writes[i + 1..].iter().find(|b| b.0 > a.1 + 50)?;
                (b.0 > 100_000).then(|| (a.clone(), b.clone()))
            })
            .unwrap_or_default();
        let r = history
            .iter()
            .position(|o| matches!(o.kind, Kind::Read { .. }) && o.call > b.1)
            .unwrap_or(0);
        history[r].kind = Kind::Read {
            got: vec![Some(a.2.clone())],
        };
        let v = linearizable(&history, Duration::from_secs(60));
        assert_eq!(v.linearizable, Some(false), "{v:?}");
    }

    // --- watches ------------------------------------------------------------------------------

    fn ev(revision: i64, key: &str, value: &str) -> Event {
        Event {
            revision,
            key: key.into(),
            put: true,
            value: value.into(),
        }
    }

    fn del(revision: i64, key: &str) -> Event {
        Event {
            revision,
            key: key.into(),
            put: false,
            value: String::new(),
        }
    }

    /// a=1 at 1, b=1 at 2, a=2 and b=2 together at 3, a deleted at 4, c=1 at 5, b=3 at 6.
    fn truth() -> Vec<Event> {
        vec![
            ev(1, "a", "1"),
            ev(2, "b", "1"),
            ev(3, "a", "2"),
            ev(3, "b", "2"),
            del(4, "a"),
            ev(5, "c", "1"),
            ev(6, "b", "3"),
        ]
    }

    fn events(header: i64, evs: &[Event]) -> WatchResponse {
        WatchResponse::Events {
            header,
            events: evs.to_vec(),
        }
    }

    fn started(from: i64) -> WatchResponse {
        WatchResponse::Started { from }
    }

    fn progress(header: i64) -> WatchResponse {
        WatchResponse::Progress { header }
    }

    fn watch(watcher: usize, start: &str, end: &str, responses: Vec<WatchResponse>) -> WatchLog {
        WatchLog {
            watcher,
            start: start.into(),
            end: end.into(),
            responses,
        }
    }

    /// Three watchers that saw everything right: [a, c) resumed once, the single key a, and
    /// every key.
    fn clean() -> Vec<WatchLog> {
        let t = truth();
        vec![
            watch(
                0,
                "a",
                "c",
                vec![
                    started(1),
                    events(2, &t[0..2]),
                    events(3, &t[2..4]),
                    progress(3),
                    started(4),
                    events(4, &t[4..5]),
                    events(6, &t[6..7]),
                    progress(6),
                ],
            ),
            watch(
                1,
                "a",
                "",
                vec![
                    started(1),
                    events(1, &[t[0].clone()]),
                    events(3, &[t[2].clone()]),
                    events(4, &[t[4].clone()]),
                    progress(6),
                ],
            ),
            watch(
                2,
                "",
                "\0",
                vec![
                    started(1),
                    events(6, &t[0..2]),
                    events(6, &t[2..6]),
                    events(6, &t[6..7]),
                ],
            ),
        ]
    }

    fn all_hold(r: &WatchReport) -> bool {
        r.ordered && r.unique && r.reliable && r.atomic && r.resumable && r.bookmarkable
    }

    #[test]
    fn clean_watches_pass_every_guarantee() {
        let logs = clean();
        let t = truth();
        for truth in [None, Some(t.as_slice())] {
            let r = check_watches(&logs, truth);
            assert!(all_hold(&r), "{r:?}");
            assert!(r.problems.is_empty());
            assert_eq!((r.watchers, r.events), (3, 6 + 3 + 7));
        }
    }

    #[test]
    fn each_guarantee_violated_alone() {
        let t = truth();
        // (name, watcher 0's responses, the guarantee that must fail)
        type Pick = fn(&WatchReport) -> bool;
        let cases: Vec<(&str, Vec<WatchResponse>, Pick)> = vec![
            (
                "out of order",
                vec![
                    started(1),
                    events(2, &[t[1].clone()]),
                    events(2, &[t[0].clone()]),
                    events(3, &t[2..4]),
                ],
                |r| r.ordered,
            ),
            (
                "delivered twice",
                vec![
                    started(1),
                    events(1, &t[0..1]),
                    events(1, &t[0..1]),
                    events(3, &t[1..4]),
                ],
                |r| r.unique,
            ),
            (
                "a gap",
                vec![started(1), events(1, &t[0..1]), events(3, &t[2..4])],
                |r| r.reliable,
            ),
            (
                "a gap at the end of a stream before a resume",
                vec![
                    started(1),
                    events(1, &t[0..1]),
                    progress(2),
                    started(3),
                    events(3, &t[2..4]),
                ],
                |r| r.reliable,
            ),
            (
                "a revision split over two responses",
                vec![
                    started(1),
                    events(2, &t[0..2]),
                    events(3, &t[2..3]),
                    events(3, &t[3..4]),
                ],
                |r| r.atomic,
            ),
            (
                "a resume that skips revisions",
                vec![
                    started(1),
                    events(2, &t[0..2]),
                    started(4),
                    events(4, &t[4..5]),
                ],
                |r| r.resumable,
            ),
            (
                "a resume from the current revision",
                vec![started(1), events(2, &t[0..2]), started(0)],
                |r| r.resumable,
            ),
            (
                "a stream that starts before its start revision",
                vec![started(2), events(2, &t[0..2]), events(3, &t[2..4])],
                |r| r.resumable,
            ),
            (
                "an event at or below a progress notification",
                vec![
                    started(1),
                    events(2, &t[0..2]),
                    progress(3),
                    events(3, &t[2..4]),
                ],
                |r| r.bookmarkable,
            ),
        ];
        for (name, responses, pick) in cases {
            let mut logs = clean();
            logs[0].responses = responses;
            for truth in [None, Some(t.as_slice())] {
                let r = check_watches(&logs, truth);
                assert!(!pick(&r), "{name} (truth: {}): {r:?}", truth.is_some());
                let held = [
                    r.ordered,
                    r.unique,
                    r.reliable,
                    r.atomic,
                    r.resumable,
                    r.bookmarkable,
                ];
                assert_eq!(
                    held.iter().filter(|h| !**h).count(),
                    1,
                    "{name} (truth: {}) broke more than one guarantee: {r:?}",
                    truth.is_some()
                );
                assert!(!r.problems.is_empty(), "{name}");
                assert!(r.problems[0].starts_with("watcher 0:"), "{name}: {r:?}");
            }
        }
    }

    #[test]
    fn truth_catches_what_the_union_cannot() {
        let t = truth();
        let cases: Vec<(&str, Vec<WatchResponse>, Pick)> = vec![
            (
                "a changed value",
                vec![started(1), events(1, &[ev(1, "a", "9")]), progress(1)],
                |r| r.reliable,
            ),
            (
                "an event that never happened",
                vec![started(1), events(1, &[ev(1, "b", "7")]), progress(1)],
                |r| r.reliable,
            ),
            (
                "half a revision, the other half never",
                vec![started(3), events(3, &t[2..3]), events(4, &t[4..5])],
                |r| r.atomic,
            ),
        ];
        type Pick = fn(&WatchReport) -> bool;
        for (name, responses, pick) in cases {
            let mut logs = clean();
            logs[0].responses = responses;
            // Watcher 2 saw everything; alone with watcher 0 the union would be wrong.
            logs.remove(1);
            logs.remove(1);
            let r = check_watches(&logs, Some(&t));
            assert!(!pick(&r), "{name}: {r:?}");
            let r = check_watches(&logs, None);
            assert!(all_hold(&r), "{name} without truth: {r:?}");
        }
    }

    #[test]
    fn union_of_watchers_catches_a_missed_event() {
        let t = truth();
        let mut logs = clean();
        // Watcher 1 (key a only) misses the delete at 4 that watchers 0 and 2 saw.
        logs[1].responses = vec![
            started(1),
            events(1, &[t[0].clone()]),
            events(3, &[t[2].clone()]),
            progress(6),
        ];
        let r = check_watches(&logs, None);
        assert!(!r.reliable, "{r:?}");
        assert!(
            r.problems.iter().any(|p| p.contains("delete a at 4")),
            "{r:?}"
        );
    }

    #[test]
    fn watchers_that_disagree_are_unreliable() {
        let mut logs = clean();
        logs[1].responses[1] = events(1, &[ev(1, "a", "other")]);
        let r = check_watches(&logs, None);
        assert!(!r.reliable, "{r:?}");
    }

    #[test]
    fn compaction_excuses_what_it_removed() {
        let t = truth();
        let mut logs = clean();
        logs[0].responses = vec![
            started(1),
            WatchResponse::Compacted {
                compact_revision: 3,
            },
            started(3),
            events(3, &t[2..4]),
            events(6, &t[4..5]),
            events(6, &t[6..7]),
            progress(6),
        ];
        for truth in [None, Some(t.as_slice())] {
            let r = check_watches(&logs, truth);
            assert!(all_hold(&r), "{r:?}");
        }
        // Without being told, the same skip is a resume that skipped revisions.
        logs[0].responses.remove(1);
        let r = check_watches(&logs, Some(&t));
        assert!(!r.resumable, "{r:?}");
    }

    #[test]
    fn event_outside_the_range_is_a_problem() {
        let t = truth();
        let mut logs = clean();
        logs[1].responses.insert(2, events(2, &t[1..2]));
        let r = check_watches(&logs, None);
        assert!(!r.reliable, "{r:?}");
        assert!(r.problems.iter().any(|p| p.contains("outside its range")));
    }

    #[test]
    fn uncovered_tail_is_not_a_gap() {
        // The header of a response with events is no promise: a stream that ends there has
        // covered only up to its last event.
        let t = truth();
        let mut logs = clean();
        logs[0].responses = vec![started(1), events(6, &t[0..2])];
        let r = check_watches(&logs, Some(&t));
        assert!(all_hold(&r), "{r:?}");
    }

    #[test]
    fn watch_ranges() {
        assert!(in_range("a", "a", ""));
        assert!(!in_range("ab", "a", ""));
        assert!(in_range("ab", "a", "b"));
        assert!(!in_range("b", "a", "b"));
        assert!(in_range("zzz", "b", "\0"));
        assert!(!in_range("a", "b", "\0"));
        assert!(in_range("", "", "\0"));
    }

    // --- revisions and lost writes ------------------------------------------------------------

    fn obs(label: &str, at: u64, revision: i64) -> (String, u64, i64) {
        (label.to_string(), at, revision)
    }

    #[test]
    fn revisions_that_never_decrease() {
        let ok = vec![
            obs("client-0", 10, 5),
            obs("client-1", 5, 9),
            obs("client-0", 30, 7),
            obs("client-0", 20, 5),
            obs("client-1", 40, 9),
        ];
        assert_eq!(revisions_monotonic(&ok), Ok(()));
        assert_eq!(revisions_monotonic(&[]), Ok(()));
    }

    #[test]
    fn revision_regressions_are_named() {
        let bad = vec![
            obs("client-0", 10, 5),
            obs("member-2", 1_500_000_000, 12),
            obs("client-0", 20, 6),
            obs("member-2", 2_250_000_000, 11),
            obs("client-0", 3_000_000_000, 4),
        ];
        let e = revisions_monotonic(&bad).unwrap_err();
        assert!(
            e.starts_with("member-2 saw revision 12 at 1.500000000 s"),
            "{e}"
        );
        assert!(e.contains("then revision 11 at 2.250000000 s"), "{e}");
        assert!(e.contains("2 regressions"), "{e}");
        // A label's own regression, reported even when observations arrive out of order.
        let e = revisions_monotonic(&[obs("c", 20, 3), obs("c", 10, 4)]).unwrap_err();
        assert!(
            e.contains("revision 4 at 0.000000010 s and then revision 3"),
            "{e}"
        );
    }

    #[test]
    fn lost_writes_are_the_missing_acknowledged_ones() {
        let acked: Vec<String> = ["ack/1", "ack/2", "ack/3", "ack/2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let found: HashSet<String> = ["ack/1", "ack/9"].iter().map(|s| s.to_string()).collect();
        assert_eq!(lost_writes(&acked, &found), vec!["ack/2", "ack/3"]);
        let all: HashSet<String> = acked.iter().cloned().collect();
        assert!(lost_writes(&acked, &all).is_empty());
    }
}
