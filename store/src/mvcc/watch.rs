//! Watchers: history replayed from the MVCC trees, then live events from the hub.
//!
//! A watcher set is one task that runs any number of watchers for one consumer: an etcd watch
//! stream multiplexes many, a Kubernetes watch or an informer is a set of one. The set
//! subscribes to the store's hub once, so a live revision wakes one task however many watchers
//! it serves, and every watcher's messages leave in one ordered channel (which is what lets a
//! progress answer promise that nothing older follows it). A watcher whose next revision is
//! not the hub's next batch (it starts in the past, the set fell behind the hub's ring buffer,
//! or a snapshot replaced the state) catches up from history, one chunk per turn of the loop,
//! so the live watchers of the set are not held up behind it. Writers never wait on watchers;
//! a slow consumer holds up only its own set. A watcher whose next revision has been compacted
//! away gets a compacted error and ends.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::store::{MvccStore, RevisionBatch};
use super::types::{Event, EventKind, KeyRange};

/// Most events read from history in one step of a catch-up.
const CATCH_UP_EVENTS: usize = 1000;

/// How long a progress request waits for the set's watchers to have passed on every event up
/// to the store's revision; etcd answers only when its watchers are in sync, and so does a set,
/// giving up (no answer, as etcd) after this long.
const IN_SYNC_WAIT: Duration = Duration::from_secs(1);

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

/// Why a set did not start a watcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The id asked for is taken by a running watcher of the set.
    DuplicateId,
    /// The consumer found the request invalid; the reason is its own.
    Invalid(String),
}

/// What a set hands its consumer, for the watcher whose id comes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetMessage {
    /// The watcher runs; `revision` was the store's when it started.
    Created {
        revision: i64,
    },
    /// The watcher was not started.
    Refused(Refusal),
    Watch(WatchMessage),
    /// The watcher ended: on request (no reason), or because its history could not be read.
    Canceled {
        reason: Option<String>,
    },
    /// The answer to [`WatchSet::request_progress`] (id -1): every watcher of the set has
    /// passed on every event up to `revision`.
    InSync {
        revision: i64,
    },
    /// Every event of a live revision, for a set started with [`WatchSet::start_sharing`]:
    /// the same `Arc` for each of its watchers that wants all of them, so that the consumer
    /// can prepare them once. With `prev_kv` the events carry the versions they replaced
    /// (each delete has one); without, the consumer leaves those out.
    Shared {
        batch: Arc<RevisionBatch>,
        prev_kv: bool,
    },
}

/// The id a set's [`SetMessage::InSync`] comes with (etcd's for a stream-wide progress).
pub const SET_ID: i64 = -1;

enum Control {
    /// Id 0 asks for the lowest free id from the set's counter on (etcd's auto watch id).
    Add {
        id: i64,
        spec: Result<WatchSpec, String>,
        /// The store's revision when the watcher was asked for: a watcher without a start
        /// revision starts after it.
        revision: i64,
    },
    Cancel {
        id: i64,
    },
    Progress,
}

/// The handle of a running watcher set. Dropping it ends the set, and so does the consumer
/// dropping its receiver.
pub struct WatchSet {
    store: Arc<MvccStore>,
    control: mpsc::Sender<Control>,
}

impl WatchSet {
    /// Starts a set that sends its messages to `out`, each turned into the consumer's item by
    /// `wrap` (which may drop it by answering `None`).
    pub fn start<T, F>(store: Arc<MvccStore>, out: mpsc::Sender<T>, wrap: F) -> WatchSet
    where
        T: Send + 'static,
        F: FnMut(i64, SetMessage) -> Option<T> + Send + 'static,
    {
        Self::spawn(store, out, wrap, false)
    }

    /// [`WatchSet::start`], where a live revision that a watcher wants whole comes as
    /// [`SetMessage::Shared`] instead of a copy of its events.
    pub fn start_sharing<T, F>(store: Arc<MvccStore>, out: mpsc::Sender<T>, wrap: F) -> WatchSet
    where
        T: Send + 'static,
        F: FnMut(i64, SetMessage) -> Option<T> + Send + 'static,
    {
        Self::spawn(store, out, wrap, true)
    }

    fn spawn<T, F>(store: Arc<MvccStore>, out: mpsc::Sender<T>, wrap: F, shares: bool) -> WatchSet
    where
        T: Send + 'static,
        F: FnMut(i64, SetMessage) -> Option<T> + Send + 'static,
    {
        let (control, requests) = mpsc::channel(64);
        let mut set = Set::new(store.clone(), Sink { out, wrap });
        set.shares_batches = shares;
        tokio::spawn(set.run(requests));
        WatchSet { store, control }
    }

    /// Starts a watcher (`id` 0: the set picks one). Its `Created` or `Refused` comes before
    /// any of its events. False when the set has ended.
    pub async fn add(&self, id: i64, spec: Result<WatchSpec, String>) -> bool {
        // Read after the set subscribed to the hub (it did before this handle existed), so
        // every later revision reaches the watcher live or from history.
        let revision = self.store.revision();
        self.control
            .send(Control::Add { id, spec, revision })
            .await
            .is_ok()
    }

    /// Ends a watcher; a running one answers `Canceled`, after which none of its events
    /// follow. False when the set has ended.
    pub async fn cancel(&self, id: i64) -> bool {
        self.control.send(Control::Cancel { id }).await.is_ok()
    }

    /// Asks for an [`SetMessage::InSync`] at the store's current revision, sent once every
    /// watcher has passed on every event up to it (within a second, else never, as etcd).
    pub async fn request_progress(&self) -> bool {
        self.control.send(Control::Progress).await.is_ok()
    }
}

/// Starts a set of one watcher and returns the receiving end of its messages; dropping it
/// stops the watcher, and the channel closes when the watcher ends (compacted).
pub fn start(
    store: Arc<MvccStore>,
    spec: WatchSpec,
    buffer: usize,
) -> mpsc::Receiver<WatchMessage> {
    let (tx, rx) = mpsc::channel(buffer.max(1));
    let wrap = |_, message| match message {
        SetMessage::Watch(m) => Some(m),
        _ => None,
    };
    let mut set = Set::new(store.clone(), Sink { out: tx, wrap });
    let (control, requests) = mpsc::channel(1);
    // Read after the set subscribed to the hub: nothing falls between history and live.
    let revision = store.revision();
    let added = control.try_send(Control::Add {
        id: 0,
        spec: Ok(spec),
        revision,
    });
    debug_assert!(added.is_ok(), "a new channel has room for one");
    drop(control);
    set.ends_with_its_watchers = true;
    tokio::spawn(set.run(requests));
    rx
}

struct Watcher {
    spec: WatchSpec,
    /// The next revision to report: everything before it has been passed on.
    next: i64,
    /// Following the hub (else catching up from history).
    live: bool,
    /// When the watcher last had a message, for `progress_every`.
    last_sent: Instant,
    _counted: Counted,
}

/// Counts a watcher in the store's watcher total while it lives.
struct Counted(Arc<MvccStore>);

impl Counted {
    fn new(store: &Arc<MvccStore>) -> Counted {
        store.watchers.fetch_add(1, Ordering::Relaxed);
        Counted(store.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.watchers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a set's messages go.
struct Sink<T, F> {
    out: mpsc::Sender<T>,
    wrap: F,
}

impl<T, F: FnMut(i64, SetMessage) -> Option<T>> Sink<T, F> {
    /// False when the consumer is gone.
    async fn send(&mut self, id: i64, message: SetMessage) -> bool {
        match (self.wrap)(id, message) {
            Some(item) => self.out.send(item).await.is_ok(),
            None => !self.out.is_closed(),
        }
    }
}

/// A set's task state.
struct Set<T, F> {
    store: Arc<MvccStore>,
    sink: Sink<T, F>,
    hub: broadcast::Receiver<Arc<RevisionBatch>>,
    watchers: BTreeMap<i64, Watcher>,
    /// Where the search for a free id starts.
    next_id: i64,
    /// Pending progress requests: the revision to answer at, and when to give up.
    in_sync_asks: VecDeque<(i64, Instant)>,
    /// A set of one ends when its watcher does, not when its handle goes (it has none).
    ends_with_its_watchers: bool,
    /// Whole live revisions go out as [`SetMessage::Shared`].
    shares_batches: bool,
}

/// What woke a set.
enum Step {
    Control(Option<Control>),
    Live(Result<Arc<RevisionBatch>, broadcast::error::RecvError>),
    ProgressDue,
    CatchUp,
    ConsumerGone,
}

impl<T, F: FnMut(i64, SetMessage) -> Option<T>> Set<T, F> {
    fn new(store: Arc<MvccStore>, sink: Sink<T, F>) -> Self {
        // Subscribed before any watcher reads the store's revision, so nothing falls between
        // history and live.
        let hub = store.subscribe();
        Set {
            store,
            sink,
            hub,
            watchers: BTreeMap::new(),
            next_id: 0,
            in_sync_asks: VecDeque::new(),
            ends_with_its_watchers: false,
            shares_batches: false,
        }
    }

    /// Runs until the consumer or the handle (`requests`) goes, or the store closes its hub;
    /// a set of one, until the consumer or its watcher goes.
    async fn run(mut self, mut requests: mpsc::Receiver<Control>) {
        let mut handle_open = true;
        loop {
            if !self.catch_up().await || !self.answer_in_sync().await {
                return;
            }
            if !handle_open && self.watchers.is_empty() {
                return;
            }
            let behind = self.watchers.values().any(|w| !w.live);
            let due = self.progress_due();
            let step = tokio::select! {
                biased;
                _ = self.sink.out.closed() => Step::ConsumerGone,
                request = requests.recv(), if handle_open => Step::Control(request),
                batch = self.hub.recv() => Step::Live(batch),
                _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => Step::ProgressDue,
                _ = std::future::ready(()), if behind => Step::CatchUp,
            };
            let going = match step {
                Step::ConsumerGone => false,
                Step::Control(None) => {
                    handle_open = false;
                    self.ends_with_its_watchers
                }
                Step::Control(Some(request)) => self.control(request).await,
                Step::Live(Ok(batch)) => self.live(batch).await,
                Step::Live(Err(broadcast::error::RecvError::Lagged(_))) => {
                    // The ring buffer overtook the set: every live watcher reads what it
                    // missed from history.
                    self.watchers.values_mut().for_each(|w| w.live = false);
                    true
                }
                Step::Live(Err(broadcast::error::RecvError::Closed)) => false,
                Step::ProgressDue => self.progress().await,
                Step::CatchUp => true,
            };
            if !going {
                return;
            }
        }
    }

    async fn control(&mut self, request: Control) -> bool {
        match request {
            Control::Add { id, spec, revision } => self.add(id, spec, revision).await,
            Control::Cancel { id } => match self.watchers.remove(&id) {
                Some(_) => {
                    self.sink
                        .send(id, SetMessage::Canceled { reason: None })
                        .await
                }
                None => true,
            },
            Control::Progress => {
                let revision = self.store.revision();
                self.in_sync_asks
                    .push_back((revision, Instant::now() + IN_SYNC_WAIT));
                true
            }
        }
    }

    async fn add(&mut self, asked: i64, spec: Result<WatchSpec, String>, revision: i64) -> bool {
        let id = if asked != 0 {
            asked
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        };
        let refusal = match spec {
            _ if asked != 0 && self.watchers.contains_key(&asked) => Err(Refusal::DuplicateId),
            Err(reason) => Err(Refusal::Invalid(reason)),
            Ok(spec) => Ok(spec),
        };
        let spec = match refusal {
            Ok(spec) => spec,
            Err(refusal) => return self.sink.send(id, SetMessage::Refused(refusal)).await,
        };
        let next = if spec.start_revision > 0 {
            spec.start_revision
        } else {
            revision + 1
        };
        self.watchers.insert(
            id,
            Watcher {
                spec,
                next,
                // Batches up to the store's revision may still be on their way through the
                // hub, or consumed before this watcher existed: only a watcher past them
                // follows it.
                live: next > self.store.revision(),
                last_sent: Instant::now(),
                _counted: Counted::new(&self.store),
            },
        );
        self.sink.send(id, SetMessage::Created { revision }).await
    }

    /// Hands a live revision to every watcher that follows the hub.
    async fn live(&mut self, batch: Arc<RevisionBatch>) -> bool {
        let now = Instant::now();
        // Whether each delete carries the version it removed (a large DeleteRange's do not).
        let prev_complete = batch
            .events
            .iter()
            .all(|e| e.kind == EventKind::Put || e.prev_kv.is_some());
        for (id, w) in self.watchers.iter_mut().filter(|(_, w)| w.live) {
            if batch.restored || batch.revision > w.next {
                // A gap, or the state was replaced under the watcher: read what it missed.
                w.live = false;
                continue;
            }
            if batch.revision < w.next {
                continue;
            }
            let whole = self.shares_batches
                && (prev_complete || !w.spec.prev_kv)
                && batch.events.iter().all(|e| wanted(&w.spec, e));
            let message = if whole {
                (!batch.events.is_empty()).then(|| SetMessage::Shared {
                    batch: batch.clone(),
                    prev_kv: w.spec.prev_kv,
                })
            } else {
                // Copy only the events this watcher wants. A large DeleteRange's events do not
                // carry the deleted versions (`DELETED_VERSIONS_IN_EVENTS`): a watcher that
                // wants them reads them.
                let events: Vec<Event> = batch
                    .events
                    .iter()
                    .filter(|e| wanted(&w.spec, e))
                    .map(|e| Event {
                        kind: e.kind,
                        kv: e.kv.clone(),
                        prev_kv: match (&e.prev_kv, w.spec.prev_kv, e.kind) {
                            (_, false, _) => None,
                            (Some(prev), true, _) => Some(prev.clone()),
                            (None, true, EventKind::Delete) => self
                                .store
                                .version_before_revision(&e.kv.key, batch.revision)
                                .ok()
                                .flatten(),
                            (None, true, EventKind::Put) => None,
                        },
                    })
                    .collect();
                (!events.is_empty()).then(|| {
                    SetMessage::Watch(WatchMessage::Events {
                        revision: batch.revision,
                        events,
                    })
                })
            };
            w.next = batch.revision + 1;
            if let Some(message) = message {
                w.last_sent = now;
                if !self.sink.send(*id, message).await {
                    return false;
                }
            }
        }
        true
    }

    /// One chunk of history for each watcher that is behind the hub; a watcher that reaches
    /// the store's revision follows the hub from then on.
    async fn catch_up(&mut self) -> bool {
        let behind: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| !w.live)
            .map(|(id, _)| *id)
            .collect();
        for id in behind {
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            let current = self.store.revision();
            if w.next > current {
                w.live = true;
                continue;
            }
            let spec = &w.spec;
            let batches = match self.store.history(
                &spec.range,
                w.next,
                current,
                spec.prev_kv,
                CATCH_UP_EVENTS,
            ) {
                Ok(batches) => batches,
                Err(crate::error::MvccError::Compacted { compact_revision }) => {
                    self.watchers.remove(&id);
                    let compacted = WatchMessage::Compacted { compact_revision };
                    if !self.sink.send(id, SetMessage::Watch(compacted)).await {
                        return false;
                    }
                    continue;
                }
                Err(e) => {
                    tracing::warn!(watch_id = id, error = %e, "watcher's history unreadable; canceled");
                    self.watchers.remove(&id);
                    let reason = Some(format!("reading the history: {e}"));
                    if !self.sink.send(id, SetMessage::Canceled { reason }).await {
                        return false;
                    }
                    continue;
                }
            };
            let full = batches.iter().map(|b| b.events.len()).sum::<usize>() >= CATCH_UP_EVENTS;
            // A partial read continues after the last revision it returned.
            let reached = match batches.last() {
                Some(last) if full => last.revision,
                _ => current,
            };
            for batch in batches {
                let events = batch
                    .events
                    .into_iter()
                    .filter(|e| wanted(&w.spec, e))
                    .map(|mut e| {
                        if !w.spec.prev_kv {
                            e.prev_kv = None;
                        }
                        e
                    })
                    .collect();
                w.next = batch.revision + 1;
                if !send_events(&mut self.sink, id, w, batch.revision, events).await {
                    return false;
                }
            }
            w.next = reached + 1;
        }
        true
    }

    /// Answers the progress requests whose revision every watcher has passed, in order;
    /// drops those that waited too long.
    async fn answer_in_sync(&mut self) -> bool {
        while let Some(&(revision, deadline)) = self.in_sync_asks.front() {
            if Instant::now() > deadline {
                self.in_sync_asks.pop_front();
                continue;
            }
            if self.watchers.values().any(|w| w.next <= revision) {
                return true;
            }
            self.in_sync_asks.pop_front();
            if !self
                .sink
                .send(SET_ID, SetMessage::InSync { revision })
                .await
            {
                return false;
            }
        }
        true
    }

    /// When the next watcher that asked for progress notifications is due one.
    fn progress_due(&self) -> Option<Instant> {
        self.watchers
            .values()
            .filter(|w| w.live)
            .filter_map(|w| w.spec.progress_every.map(|every| w.last_sent + every))
            .min()
    }

    /// Sends a progress notification to every live watcher that has had no message for its
    /// `progress_every`.
    async fn progress(&mut self) -> bool {
        let now = Instant::now();
        for (id, w) in self.watchers.iter_mut().filter(|(_, w)| w.live) {
            let Some(every) = w.spec.progress_every else {
                continue;
            };
            if w.last_sent + every > now {
                continue;
            }
            w.last_sent = now;
            let progress = WatchMessage::Progress {
                revision: w.next - 1,
            };
            if !self.sink.send(*id, SetMessage::Watch(progress)).await {
                return false;
            }
        }
        true
    }
}

/// Whether the watcher reports `event`.
fn wanted(spec: &WatchSpec, event: &Event) -> bool {
    spec.range.contains(&event.kv.key)
        && !(spec.no_put && event.kind == EventKind::Put)
        && !(spec.no_delete && event.kind == EventKind::Delete)
}

/// Sends one revision's events of a watcher (nothing when it wants none); false when the
/// consumer is gone.
async fn send_events<T, F: FnMut(i64, SetMessage) -> Option<T>>(
    sink: &mut Sink<T, F>,
    id: i64,
    w: &mut Watcher,
    revision: i64,
    events: Vec<Event>,
) -> bool {
    if events.is_empty() {
        return true;
    }
    w.last_sent = Instant::now();
    let message = WatchMessage::Events { revision, events };
    sink.send(id, SetMessage::Watch(message)).await
}
