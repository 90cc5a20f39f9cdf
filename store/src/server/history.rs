//! What a member remembers of its recent past, for the status page (`status_page/`): the
//! leader changes and snapshots (Raft's and the scheduled ones) of the last hours, as they
//! happen, and every [`SAMPLE_INTERVAL`] a sample of the proposal rate, commit latency and
//! fsync latency, from the member's own metrics, for the last hour. Kept in memory only: a
//! restarted member starts a new history.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use prometheus_client::metrics::histogram::Histogram;
use serde::Serialize;

use super::node::Node;
use crate::raft::NodeId;

/// How often the member samples its metrics.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// Samples kept: one hour at [`SAMPLE_INTERVAL`].
pub const SAMPLES: usize = 360;
/// Events older than this are forgotten.
pub const EVENT_AGE: Duration = Duration::from_secs(6 * 3600);
/// At most this many events are kept, however young (a flapping leader must not grow memory).
pub const MAX_EVENTS: usize = 1000;

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum EventKind {
    /// This member (re)started: the history begins here.
    #[serde(rename_all = "camelCase")]
    Started { member: String },
    /// A leader is known again, or another one than before.
    #[serde(rename_all = "camelCase")]
    Leader {
        #[serde(serialize_with = "hex")]
        leader: NodeId,
        term: u64,
    },
    /// This member knows no leader (an election is under way, or it is cut off).
    #[serde(rename_all = "camelCase")]
    NoLeader { term: u64 },
    /// This member built a Raft snapshot of its state machine (and may purge its log behind it).
    #[serde(rename_all = "camelCase")]
    RaftSnapshotBuilt { index: u64, term: u64 },
    /// This member installed a Raft snapshot sent by the leader (it was too far behind).
    #[serde(rename_all = "camelCase")]
    RaftSnapshotInstalled { index: u64, term: u64 },
    /// A scheduled backup snapshot (`--snapshot-interval`) this member wrote as leader.
    #[serde(rename_all = "camelCase")]
    ScheduledSnapshot {
        file: String,
        revision: i64,
        bytes: u64,
    },
    #[serde(rename_all = "camelCase")]
    ScheduledSnapshotFailed { error: String },
}

fn hex<S: serde::Serializer>(id: &NodeId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:x}"))
}

fn rfc3339<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    #[serde(serialize_with = "rfc3339")]
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// Latency of the observations of one sample interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    pub mean_ms: f64,
    /// Estimated from the histogram's buckets, as Prometheus' `histogram_quantile` does.
    pub p99_ms: f64,
}

/// One [`SAMPLE_INTERVAL`] of a member's work.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// The end of the interval.
    #[serde(serialize_with = "rfc3339")]
    pub at: DateTime<Utc>,
    /// Proposals this member handled as leader, per second.
    pub proposals_per_second: f64,
    /// Raft entries committed in the cluster, per second (as this member learnt of them).
    pub entries_per_second: f64,
    /// Time from proposal to apply on the leader (none: no proposal in the interval).
    pub commit: Option<Latency>,
    /// Time of the write-ahead log's fdatasync (none: no fsync in the interval).
    pub fsync: Option<Latency>,
}

/// The member's recent events and samples.
#[derive(Default)]
pub struct History {
    events: Mutex<VecDeque<Event>>,
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn record(&self, kind: EventKind) {
        self.record_at(Utc::now(), kind);
    }

    fn record_at(&self, at: DateTime<Utc>, kind: EventKind) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.push_back(Event { at, kind });
        let oldest = at - chrono::Duration::from_std(EVENT_AGE).unwrap_or(chrono::Duration::MAX);
        while events.len() > MAX_EVENTS || events.front().is_some_and(|e| e.at < oldest) {
            events.pop_front();
        }
    }

    fn push_sample(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push_back(sample);
        while samples.len() > SAMPLES {
            samples.pop_front();
        }
    }

    /// The events of the last [`EVENT_AGE`], oldest first.
    pub fn events(&self) -> Vec<Event> {
        let oldest =
            Utc::now() - chrono::Duration::from_std(EVENT_AGE).unwrap_or(chrono::Duration::MAX);
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().filter(|e| e.at >= oldest).cloned().collect()
    }

    /// The samples of the last hour, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().cloned().collect()
    }
}

/// A histogram's state at one moment. prometheus_client reads a histogram only through its
/// encoder, so this encodes it alone and reads the OpenMetrics text back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramReading {
    pub sum: f64,
    pub count: u64,
    /// (upper bound, cumulative count), ascending; the last is +Inf.
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramReading {
    pub fn of(histogram: &Histogram) -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("h", "", histogram.clone());
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        Self::parse(&text)
    }

    /// Reads the lines of one histogram named `h` (unknown lines are skipped).
    fn parse(text: &str) -> Self {
        let mut reading = Self::default();
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("h_sum ") {
                reading.sum = v.trim().parse().unwrap_or(0.0);
            } else if let Some(v) = line.strip_prefix("h_count ") {
                reading.count = v.trim().parse().unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("h_bucket{le=\"") {
                let Some((le, count)) = rest.split_once("\"}") else {
                    continue;
                };
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                let count = count.split_whitespace().next().and_then(|c| c.parse().ok());
                reading.buckets.push((le, count.unwrap_or(0)));
            }
        }
        reading
    }

    /// The latency of what was observed after `earlier` (none when nothing was).
    pub fn since(&self, earlier: &HistogramReading) -> Option<Latency> {
        let count = self.count.checked_sub(earlier.count).filter(|c| *c > 0)?;
        let sum = (self.sum - earlier.sum).max(0.0);
        let buckets: Vec<(f64, u64)> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, (le, c))| {
                let before = earlier.buckets.get(i).map_or(0, |b| b.1);
                (*le, c.saturating_sub(before))
            })
            .collect();
        Some(Latency {
            mean_ms: sum / count as f64 * 1000.0,
            p99_ms: quantile(0.99, &buckets) * 1000.0,
        })
    }
}

/// The `q` quantile of cumulative buckets, interpolated linearly inside the bucket it falls
/// in (Prometheus' `histogram_quantile`); in the +Inf bucket, the highest finite bound.
fn quantile(q: f64, buckets: &[(f64, u64)]) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return 0.0;
    };
    if total == 0 {
        return 0.0;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(le, count) in buckets {
        if count as f64 >= rank {
            if le.is_infinite() {
                return lower.0;
            }
            let inside = (count - lower.1) as f64;
            if inside == 0.0 {
                return le;
            }
            return lower.0 + (le - lower.0) * (rank - lower.1 as f64) / inside;
        }
        lower = (le, count);
    }
    lower.0
}

/// What one sample is computed from.
struct Reading {
    at: Instant,
    proposals: HistogramReading,
    fsyncs: HistogramReading,
    committed: u64,
}

impl Reading {
    fn take(node: &Node) -> Self {
        Self {
            at: Instant::now(),
            proposals: HistogramReading::of(&node.metrics.proposal_seconds),
            fsyncs: HistogramReading::of(&node.metrics.fsync_seconds),
            committed: super::node::committed_index(&node.committed),
        }
    }

    fn sample_since(&self, earlier: &Reading, at: DateTime<Utc>) -> Sample {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64().max(0.001);
        Sample {
            at,
            proposals_per_second: self.proposals.count.saturating_sub(earlier.proposals.count)
                as f64
                / seconds,
            entries_per_second: self.committed.saturating_sub(earlier.committed) as f64 / seconds,
            commit: self.proposals.since(&earlier.proposals),
            fsync: self.fsyncs.since(&earlier.fsyncs),
        }
    }
}

/// Records the member's history until `stopped`: leader changes and Raft snapshots as openraft
/// reports them, and a sample every [`SAMPLE_INTERVAL`]. `snapshots` is the state machine's
/// [`crate::raft::state_machine::StateMachine::snapshot_watermark`]: it moves only when a
/// snapshot is made durable, so the task wakes for snapshots, not for every write.
pub async fn record(
    node: Arc<Node>,
    mut snapshots: tokio::sync::watch::Receiver<u64>,
    stopped: impl Future<Output = ()>,
) {
    tokio::pin!(stopped);
    let history = node.metrics.history.clone();
    history.record(EventKind::Started {
        member: node.name.clone(),
    });
    let mut server = node.raft.server_metrics();
    // A leader known before this task subscribed is an event too.
    server.mark_changed();
    // openraft's full metrics change with every entry: followed only while a snapshot made
    // durable waits to be reported.
    let mut raft = node.raft.metrics();
    let mut pending: Option<u64> = None;
    // The snapshot already on disk at start is no event.
    let mut snapshot = raft.borrow().snapshot;
    // No leader is known at start; the first one known is an event.
    let mut leader = (None, 0);
    let mut installs = node.metrics.snapshot_installs.load(Ordering::Relaxed);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + SAMPLE_INTERVAL,
        SAMPLE_INTERVAL,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Reading::take(&node);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {
                let now = Reading::take(&node);
                history.push_sample(now.sample_since(&last, Utc::now()));
                last = now;
            }
            changed = server.changed() => {
                if changed.is_err() {
                    return;
                }
                let (now_leader, term) = {
                    let m = server.borrow_and_update();
                    (m.current_leader, m.vote.leader_id().get_term())
                };
                // A term change with the same leader is a new election it won again.
                let seen = (now_leader, if now_leader.is_some() { term } else { 0 });
                if seen != leader {
                    history.record(match now_leader {
                        Some(id) => EventKind::Leader { leader: id, term },
                        None => EventKind::NoLeader { term },
                    });
                    leader = seen;
                }
            }
            changed = snapshots.changed() => {
                if changed.is_err() {
                    return;
                }
                // openraft reports the snapshot once its install or build returns, which for
                // an install is after the restore: follow its metrics until then.
                pending = Some(*snapshots.borrow_and_update());
                raft.mark_changed();
            }
            changed = raft.changed(), if pending.is_some() => {
                if changed.is_err() {
                    return;
                }
                let reported = raft.borrow_and_update().snapshot;
                let Some(now_snapshot) =
                    reported.filter(|s| pending.is_some_and(|durable| s.index >= durable))
                else {
                    continue;
                };
                pending = None;
                if Some(now_snapshot) != snapshot {
                    let now_installs = node.metrics.snapshot_installs.load(Ordering::Relaxed);
                    let (index, term) = (now_snapshot.index, now_snapshot.leader_id.term);
                    history.record(if now_installs != installs {
                        EventKind::RaftSnapshotInstalled { index, term }
                    } else {
                        EventKind::RaftSnapshotBuilt { index, term }
                    });
                    installs = now_installs;
                    snapshot = Some(now_snapshot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::exponential_buckets;

    #[test]
    fn a_histogram_reads_back_as_it_was_observed() {
        let h = Histogram::new(exponential_buckets(0.001, 2.0, 4));
        let empty = HistogramReading::of(&h);
        assert_eq!(empty.count, 0);
        assert_eq!(empty.buckets.len(), 5, "{empty:?}");
        for v in [0.0005, 0.0015, 0.0015, 0.003, 10.0] {
            h.observe(v);
        }
        let read = HistogramReading::of(&h);
        assert_eq!(read.count, 5);
        assert!((read.sum - 10.0065).abs() < 1e-9, "{read:?}");
        assert_eq!(
            read.buckets,
            vec![
                (0.001, 1),
                (0.002, 3),
                (0.004, 4),
                (0.008, 4),
                (f64::INFINITY, 5)
            ]
        );
    }

    #[test]
    fn latency_covers_only_what_came_after_the_earlier_reading() {
        let h = Histogram::new(exponential_buckets(0.001, 2.0, 4));
        h.observe(5.0);
        let earlier = HistogramReading::of(&h);
        assert_eq!(
            HistogramReading::of(&h).since(&earlier),
            None,
            "nothing new"
        );
        for _ in 0..100 {
            h.observe(0.0015);
        }
        let latency = HistogramReading::of(&h)
            .since(&earlier)
            .expect("observations");
        assert!((latency.mean_ms - 1.5).abs() < 1e-9, "{latency:?}");
        // All 100 in (1 ms, 2 ms]: the 99th of them is interpolated at 1.99 ms.
        assert!((latency.p99_ms - 1.99).abs() < 1e-9, "{latency:?}");
    }

    #[test]
    fn quantiles_interpolate_inside_their_bucket() {
        // (quantile, cumulative buckets, expected)
        type Case = (f64, &'static [(f64, u64)], f64);
        let cases: &[Case] = &[
            (0.99, &[], 0.0),
            (0.99, &[(1.0, 0), (f64::INFINITY, 0)], 0.0),
            (0.5, &[(1.0, 10), (2.0, 20), (f64::INFINITY, 20)], 1.0),
            (0.75, &[(1.0, 10), (2.0, 20), (f64::INFINITY, 20)], 1.5),
            // In the +Inf bucket: the highest finite bound.
            (0.99, &[(1.0, 10), (2.0, 10), (f64::INFINITY, 20)], 2.0),
        ];
        for (q, buckets, want) in cases {
            let got = quantile(*q, buckets);
            assert!(
                (got - want).abs() < 1e-9,
                "q{q} of {buckets:?}: {got}, want {want}"
            );
        }
    }

    #[test]
    fn events_keep_the_last_hours_and_a_bounded_count() {
        let h = History::default();
        let now = Utc::now();
        let old = now - chrono::Duration::hours(7);
        h.record_at(old, EventKind::NoLeader { term: 1 });
        h.record_at(now, EventKind::Leader { leader: 1, term: 2 });
        assert_eq!(
            h.events().iter().map(|e| &e.kind).collect::<Vec<_>>(),
            [&EventKind::Leader { leader: 1, term: 2 }],
            "a seven-hour-old event is dropped"
        );
        for term in 0..(MAX_EVENTS as u64 + 10) {
            h.record_at(now, EventKind::NoLeader { term });
        }
        let events = h.events();
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].kind, EventKind::NoLeader { term: 10 });
    }

    #[test]
    fn samples_keep_one_hour() {
        let h = History::default();
        for n in 0..(SAMPLES + 5) {
            h.push_sample(Sample {
                at: Utc::now(),
                proposals_per_second: n as f64,
                entries_per_second: 0.0,
                commit: None,
                fsync: None,
            });
        }
        let samples = h.samples();
        assert_eq!(samples.len(), SAMPLES);
        assert_eq!(samples[0].proposals_per_second, 5.0);
    }

    #[test]
    fn events_serialize_with_their_kind_and_time() {
        let at = DateTime::parse_from_rfc3339("2024-05-01T10:00:00Z")
            .expect("time")
            .with_timezone(&Utc);
        let e = Event {
            at,
            kind: EventKind::Leader {
                leader: 0xab,
                term: 3,
            },
        };
        assert_eq!(
            serde_json::to_value(&e).expect("json"),
            serde_json::json!({"at": "2024-05-01T10:00:00.000Z", "kind": "leader", "leader": "ab", "term": 3})
        );
    }
}
