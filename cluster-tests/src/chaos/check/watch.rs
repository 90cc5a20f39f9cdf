//! etcd's watch guarantees over every watcher's stream.

use std::collections::{BTreeMap, HashMap};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
