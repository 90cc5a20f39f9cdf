//! Checkers over what a campaign's clients saw, all pure functions of recorded histories:
//!
//! - [`linearizable`]: whether the register and transaction operations fit one sequential
//!   order that respects real time (Wing & Gong's search with Lowe's memo of linearized set and
//!   state, checked per group of keys, since linearizability is local);
//! - [`check_watches`]: etcd's watch guarantees (ordered, unique, reliable, atomic, resumable,
//!   bookmarkable) over every watcher's stream;
//! - [`revisions_monotonic`]: header revisions never go back for one observer;
//! - [`lost_writes`]: acknowledged writes missing at the end.

mod linearizability;
mod lost_writes;
mod revisions;
mod search;
mod watch;

pub use linearizability::{linearizable, Kind, Op, Verdict};
pub use lost_writes::lost_writes;
pub use revisions::revisions_monotonic;
pub use watch::{check_watches, Event, WatchLog, WatchReport, WatchResponse};

/// Nanoseconds since the campaign began, as seconds.
fn seconds(ns: u64) -> String {
    format!("{}.{:09} s", ns / 1_000_000_000, ns % 1_000_000_000)
}
