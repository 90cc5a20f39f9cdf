//! Expectations, as Kubernetes' ReplicaSet controller keeps them: after a sync creates or
//! deletes pods, the next sync of that set waits until the informer has observed them (or
//! until the expectation is old enough to be distrusted), so it never acts on a cache that does
//! not show its own last writes yet.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// After this long an unmet expectation is assumed lost (Kubernetes: 5 minutes).
const TTL: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Pending {
    adds: i64,
    deletes: HashSet<String>,
    since: Instant,
}

#[derive(Debug, Default)]
pub struct Expectations {
    by_set: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Pending>) -> R) -> R {
        f(&mut self.by_set.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn expect_creations(&self, set: &str, n: i64) {
        self.with(|m| {
            let p = m.entry(set.to_string()).or_insert(Pending {
                adds: 0,
                deletes: HashSet::new(),
                since: Instant::now(),
            });
            p.adds += n;
            p.since = Instant::now();
        })
    }

    pub fn expect_deletions(&self, set: &str, pods: Vec<String>) {
        self.with(|m| {
            let p = m.entry(set.to_string()).or_insert(Pending {
                adds: 0,
                deletes: HashSet::new(),
                since: Instant::now(),
            });
            p.deletes.extend(pods);
            p.since = Instant::now();
        })
    }

    pub fn creation_observed(&self, set: &str) {
        self.with(|m| {
            if let Some(p) = m.get_mut(set) {
                p.adds -= 1;
            }
        })
    }

    pub fn deletion_observed(&self, set: &str, pod: &str) {
        self.with(|m| {
            if let Some(p) = m.get_mut(set) {
                p.deletes.remove(pod);
            }
        })
    }

    /// Whether the set's last writes have all been observed (or are too old to wait for).
    pub fn satisfied(&self, set: &str) -> bool {
        self.with(|m| match m.get(set) {
            None => true,
            Some(p) if (p.adds <= 0 && p.deletes.is_empty()) || p.since.elapsed() > TTL => {
                m.remove(set);
                true
            }
            Some(_) => false,
        })
    }

    pub fn forget(&self, set: &str) {
        self.with(|m| {
            m.remove(set);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_waits_for_its_own_writes() {
        let e = Expectations::default();
        assert!(e.satisfied("ns/web"));
        e.expect_creations("ns/web", 2);
        assert!(!e.satisfied("ns/web"));
        e.creation_observed("ns/web");
        assert!(!e.satisfied("ns/web"));
        e.creation_observed("ns/web");
        assert!(e.satisfied("ns/web"));
        e.expect_deletions("ns/web", vec!["ns/a".into(), "ns/b".into()]);
        e.deletion_observed("ns/web", "ns/a");
        assert!(!e.satisfied("ns/web"));
        e.deletion_observed("ns/web", "ns/b");
        assert!(e.satisfied("ns/web"));
    }
}
