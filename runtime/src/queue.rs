//! A work queue as Kubernetes' controllers use one: a key waits at most once however often it is
//! added; a key being processed is not handed out again until `done`, and if it was added
//! meanwhile it comes back after; failures come back after a per-key exponential backoff.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

const BASE_DELAY: Duration = Duration::from_millis(5);
const MAX_DELAY: Duration = Duration::from_secs(60);

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    waiting: HashSet<String>,
    processing: HashSet<String>,
    /// Added while processing: queued again at `done`.
    dirty: HashSet<String>,
    failures: HashMap<String, u32>,
    shut: bool,
}

#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    ready: Notify,
}

impl WorkQueue {
    pub fn new() -> WorkQueue {
        WorkQueue::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn add(&self, key: &str) {
        let mut s = self.lock();
        if s.shut {
            return;
        }
        if s.processing.contains(key) {
            s.dirty.insert(key.to_string());
            return;
        }
        if s.waiting.insert(key.to_string()) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.ready.notify_one();
        }
    }

    /// Adds `key` after `delay` (the queue must outlive the delay; it is shared by Arc).
    pub fn add_after(self: &std::sync::Arc<Self>, key: &str, delay: Duration) {
        let this = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            this.add(&key);
        });
    }

    /// Adds `key` again after its backoff, which doubles with each failure in a row.
    pub fn retry(self: &std::sync::Arc<Self>, key: &str) {
        let n = {
            let mut s = self.lock();
            let n = s.failures.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let delay = BASE_DELAY.saturating_mul(1u32 << n.min(20)).min(MAX_DELAY);
        self.add_after(key, delay);
    }

    /// The key succeeded: its backoff starts over.
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// The next key to process; None once shut down.
    pub async fn next(&self) -> Option<String> {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                if s.shut {
                    return None;
                }
                if let Some(k) = s.queue.pop_front() {
                    s.waiting.remove(&k);
                    s.processing.insert(k.clone());
                    if !s.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(k);
                }
            }
            notified.await;
        }
    }

    pub fn done(&self, key: &str) {
        let again = {
            let mut s = self.lock();
            s.processing.remove(key);
            s.dirty.remove(key)
        };
        if again {
            self.add(key);
        }
    }

    pub fn shut_down(&self) {
        self.lock().shut = true;
        self.ready.notify_waiters();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().queue.len()
    }
}

/// What one sync returns: when to look at the key again (None: when something changes), or
/// an error, after which the key comes back with backoff.
pub type Outcome = Result<Option<Duration>, rkube_api::error::ApiError>;

/// Runs `workers` loops that take keys from `queue` into `sync` once every informer in `caches`
/// holds its first list (acting on a partial cache would create what exists), until `stop`.
pub fn run_workers<F, Fut>(
    name: &'static str,
    queue: std::sync::Arc<WorkQueue>,
    workers: usize,
    caches: Vec<std::sync::Arc<crate::informer::Informer>>,
    stop: tokio::sync::watch::Receiver<bool>,
    sync: F,
) where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Outcome> + Send,
{
    let synced = caches.iter().map(|c| c.synced()).collect();
    run_workers_when_synced(name, queue, workers, synced, stop, sync)
}

/// [`run_workers`], waiting on `synced` receivers (an informer's, or a typed store's).
pub fn run_workers_when_synced<F, Fut, E>(
    name: &'static str,
    queue: std::sync::Arc<WorkQueue>,
    workers: usize,
    synced: Vec<tokio::sync::watch::Receiver<bool>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    sync: F,
) where
    F: Fn(String) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Option<Duration>, E>> + Send,
    E: std::fmt::Display,
{
    for _ in 0..workers {
        let (queue, mut synced, sync) = (queue.clone(), synced.clone(), sync.clone());
        tokio::spawn(async move {
            for s in &mut synced {
                let _ = s.wait_for(|s| *s).await;
            }
            while let Some(key) = queue.next().await {
                match sync(key.clone()).await {
                    Ok(again) => {
                        queue.forget(&key);
                        if let Some(after) = again {
                            queue.add_after(&key, after);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(key, error = %e, controller = name, "sync failed; retrying");
                        queue.retry(&key);
                    }
                }
                queue.done(&key);
            }
        });
    }
    tokio::spawn(async move {
        let _ = stop.wait_for(|s| *s).await;
        queue.shut_down();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn keys_are_deduplicated_and_never_processed_twice_at_once() {
        let q = Arc::new(WorkQueue::new());
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let k = q.next().await.unwrap();
        assert_eq!(k, "a");
        // Added while processing: not handed out until done.
        q.add("a");
        assert_eq!(q.next().await.unwrap(), "b");
        assert_eq!(q.len(), 0);
        q.done("a");
        assert_eq!(q.next().await.unwrap(), "a");
        q.done("a");
        q.done("b");
        q.shut_down();
        assert!(q.next().await.is_none());
    }

    #[tokio::test]
    async fn failures_come_back_after_a_backoff() {
        let q = Arc::new(WorkQueue::new());
        q.add("a");
        let k = q.next().await.unwrap();
        q.done(&k);
        q.retry(&k);
        let again = tokio::time::timeout(Duration::from_secs(5), q.next())
            .await
            .expect("retried");
        assert_eq!(again.as_deref(), Some("a"));
    }
}
