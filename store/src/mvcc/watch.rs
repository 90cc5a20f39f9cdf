//! Watchers: history replayed from the MVCC trees, then live events from the hub.
//!
//! Each watcher is a task that owns a bounded channel to its consumer. While it is in sync it
//! forwards the hub's batches; when its consumer is slow the task waits on its own channel, the
//! hub's ring buffer overtakes it (`Lagged`), and it catches up from history. Writers never wait
//! on a watcher. A watcher whose next revision has been compacted away gets a compacted error
//! and stops.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use super::store::{MvccStore, RevisionBatch};
use super::types::{Event, EventKind, KeyRange};

/// Most events read from history in one step of a catch-up.
const CATCH_UP_EVENTS: usize = 1000;

#[derive(Debug, Clone, Default)]
pub struct WatchSpec {
    pub range: KeyRange,
    /// First revision to report; zero or less means "from the next revision".
    pub start_revision: i64,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    /// Send a progress notification (an empty batch) after this long without events.
    pub progress_every: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Events of one revision (never split across messages).
    Events { revision: i64, events: Vec<Event> },
    /// Nothing happened in range; everything up to `revision` has been reported.
    Progress { revision: i64 },
    /// The watcher's next revision is compacted; it is cancelled.
    Compacted { compact_revision: i64 },
}

/// How far a watcher has got, for answering progress requests without running ahead of its
/// events: every event up to `position` has been handed to the watcher's channel, `sent`
/// messages were put in it, and the consumer counts the ones it has passed on in `passed`.
/// When `passed` equals `sent` (read after `position`), the consumer has passed on every event
/// up to `position`.
#[derive(Debug, Default)]
pub struct Delivery {
    position: AtomicI64,
    sent: AtomicU64,
    passed: AtomicU64,
}

impl Delivery {
    /// The consumer passed one message on.
    pub fn passed_one(&self) {
        self.passed.fetch_add(1, Ordering::SeqCst);
    }

    /// The revision up to which the consumer has passed on every event, if it has passed on
    /// everything the watcher sent it so far.
    pub fn delivered(&self) -> Option<i64> {
        let position = self.position.load(Ordering::SeqCst);
        let sent = self.sent.load(Ordering::SeqCst);
        (self.passed.load(Ordering::SeqCst) == sent).then_some(position)
    }

    async fn send(&self, tx: &mpsc::Sender<WatchMessage>, msg: WatchMessage) -> bool {
        self.sent.fetch_add(1, Ordering::SeqCst);
        tx.send(msg).await.is_ok()
    }

    fn reached(&self, revision: i64) {
        self.position.fetch_max(revision, Ordering::SeqCst);
    }
}

/// Starts a watcher. Returns the receiving end; dropping it stops the watcher.
pub fn start(
    store: Arc<MvccStore>,
    spec: WatchSpec,
    buffer: usize,
) -> mpsc::Receiver<WatchMessage> {
    start_tracked(store, spec, buffer).0
}

/// Starts a watcher whose delivery is tracked: the consumer calls [`Delivery::passed_one`]
/// for every message it passes on.
pub fn start_tracked(
    store: Arc<MvccStore>,
    spec: WatchSpec,
    buffer: usize,
) -> (mpsc::Receiver<WatchMessage>, Arc<Delivery>) {
    let (tx, rx) = mpsc::channel(buffer.max(1));
    // Subscribe before reading the current revision, so nothing falls between history and live.
    let live = store.subscribe();
    let next = if spec.start_revision > 0 {
        spec.start_revision
    } else {
        store.revision() + 1
    };
    let delivery = Arc::new(Delivery::default());
    delivery.reached(next - 1);
    tokio::spawn(run(store, spec, live, next, tx, delivery.clone()));
    (rx, delivery)
}

async fn run(
    store: Arc<MvccStore>,
    spec: WatchSpec,
    mut live: broadcast::Receiver<Arc<RevisionBatch>>,
    mut next: i64,
    tx: mpsc::Sender<WatchMessage>,
    delivery: Arc<Delivery>,
) {
    loop {
        // Catch up from history until the next revision is the store's next one.
        loop {
            let current = store.revision();
            if next > current {
                break;
            }
            let batches =
                match store.history(&spec.range, next, current, spec.prev_kv, CATCH_UP_EVENTS) {
                    Ok(b) => b,
                    Err(crate::error::MvccError::Compacted { compact_revision }) => {
                        let _ = delivery
                            .send(&tx, WatchMessage::Compacted { compact_revision })
                            .await;
                        return;
                    }
                    Err(_) => return,
                };
            let mut reached = current;
            let full = batches.iter().map(|b| b.events.len()).sum::<usize>() >= CATCH_UP_EVENTS;
            if full {
                // A partial read: continue after the last revision it returned.
                reached = batches.last().map_or(current, |b| b.revision);
            }
            for batch in batches {
                let events = batch
                    .events
                    .into_iter()
                    .filter(|e| wanted(&spec, e))
                    .map(|mut e| {
                        if !spec.prev_kv {
                            e.prev_kv = None;
                        }
                        e
                    })
                    .collect();
                if !send_batch(&tx, &delivery, batch.revision, events).await {
                    return;
                }
            }
            next = reached + 1;
            delivery.reached(reached);
        }
        // Follow live events.
        loop {
            let received = match spec.progress_every {
                Some(every) => match tokio::time::timeout(every, live.recv()).await {
                    Ok(r) => r,
                    Err(_) => {
                        if !delivery
                            .send(&tx, WatchMessage::Progress { revision: next - 1 })
                            .await
                        {
                            return;
                        }
                        continue;
                    }
                },
                None => live.recv().await,
            };
            match received {
                Ok(batch) => {
                    if batch.restored || batch.revision > next {
                        // The state was replaced under the watcher: read what it missed from history.
                        break;
                    }
                    if batch.revision < next {
                        continue;
                    }
                    // The batch is shared by every watcher: copy only the events this one
                    // wants. A large DeleteRange's events do not carry the deleted versions
                    // (`DELETED_VERSIONS_IN_EVENTS`): a watcher that wants them reads them.
                    let events = batch
                        .events
                        .iter()
                        .filter(|e| wanted(&spec, e))
                        .map(|e| Event {
                            kind: e.kind,
                            kv: e.kv.clone(),
                            prev_kv: match (&e.prev_kv, spec.prev_kv, e.kind) {
                                (_, false, _) => None,
                                (Some(prev), true, _) => Some(prev.clone()),
                                (None, true, EventKind::Delete) => store
                                    .version_before_revision(&e.kv.key, batch.revision)
                                    .ok()
                                    .flatten(),
                                (None, true, EventKind::Put) => None,
                            },
                        })
                        .collect();
                    if !send_batch(&tx, &delivery, batch.revision, events).await {
                        return;
                    }
                    next = batch.revision + 1;
                    delivery.reached(batch.revision);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Whether the watcher reports `event`.
fn wanted(spec: &WatchSpec, event: &Event) -> bool {
    spec.range.contains(&event.kv.key)
        && !(spec.no_put && event.kind == EventKind::Put)
        && !(spec.no_delete && event.kind == EventKind::Delete)
}

/// Sends one revision's events (those the watcher wants, see [`wanted`]); false when the
/// consumer is gone.
async fn send_batch(
    tx: &mpsc::Sender<WatchMessage>,
    delivery: &Delivery,
    revision: i64,
    events: Vec<Event>,
) -> bool {
    if events.is_empty() {
        return !tx.is_closed();
    }
    let sent = delivery
        .send(tx, WatchMessage::Events { revision, events })
        .await;
    delivery.reached(revision);
    sent
}
