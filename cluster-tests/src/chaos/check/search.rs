//! The search for a linear order of one key group's operations (Wing & Gong with Lowe's
//! memo).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use super::linearizability::{some, Group, GroupOp, Kind, Op, State, Step};
use super::seconds;

pub(super) enum Outcome {
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
pub(super) struct Search<'g, 'h> {
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
    pub(super) fn new(history: &'h [Op], group: &'g Group<'h>) -> Self {
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

    pub(super) fn run(mut self, deadline: Instant) -> Outcome {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::linearizability::linearizable;
    use super::super::linearizability::tests::keys;
    use super::*;

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
}
