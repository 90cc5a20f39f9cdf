//! The watchers: list, watch, resume, and the gaps between what they covered and what they
//! delivered.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Resource};
use tokio::sync::watch;

use super::shared::{member, pause_or_stop, rv_of, Answer, Cursor, Shared};
use super::violation::Violation;
use super::WATCH_IDLE;

/// One watch request: from where, what it delivered, and how far it vouched for.
#[derive(Debug, Clone)]
pub(super) struct Session {
    member: usize,
    start: i64,
    /// The newest version delivered or bookmarked: every event up to it was sent.
    covered: i64,
    pub(super) events: Vec<(i64, String)>,
}

/// What a watcher does with the state it lists and the events it sees.
pub(super) trait View<K>: Send {
    fn listed(&mut self, items: &[K], rv: i64, shared: &Shared);
    fn event(&mut self, deleted: bool, object: &K, rv: i64, shared: &Shared);
}

/// Lists, watches from the list's version, resumes from the newest version seen (on the next
/// member when its member failed), and lists again only after 410 Gone.
pub(super) struct Follower<V> {
    pub(super) shared: Arc<Shared>,
    pub(super) who: String,
    pub(super) labels: String,
    pub(super) cursor: Cursor,
    pub(super) covered: Arc<AtomicI64>,
    pub(super) sessions: Vec<Session>,
    pub(super) last_list: i64,
    pub(super) view: V,
}

enum End {
    Gone,
    Failed,
    Closed,
    Stopped,
}

/// The object types a follower lists and watches.
pub(super) trait Watched:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + 'static
{
}

impl<K> Watched for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + 'static
{
}

impl<V> Follower<V> {
    pub(super) async fn run<K>(mut self, mut stop: watch::Receiver<bool>) -> Self
    where
        K: Watched,
        V: View<K>,
    {
        loop {
            let Some(rv) = self.list::<K>(&mut stop).await else {
                return self;
            };
            self.covered.store(rv, Ordering::SeqCst);
            loop {
                let mut session = Session {
                    member: self.cursor.member,
                    start: self.covered.load(Ordering::SeqCst),
                    covered: self.covered.load(Ordering::SeqCst),
                    events: Vec::new(),
                };
                let end = self.watch::<K>(&mut session, &mut stop).await;
                self.sessions.push(session);
                match end {
                    End::Gone => break,
                    End::Stopped => return self,
                    End::Closed => {}
                    End::Failed => {
                        self.cursor.next();
                        if pause_or_stop(Duration::from_millis(200), &mut stop).await {
                            return self;
                        }
                    }
                }
            }
        }
    }

    /// Lists until a member answers; None when told to stop first.
    async fn list<K>(&mut self, stop: &mut watch::Receiver<bool>) -> Option<i64>
    where
        K: Watched,
        V: View<K>,
    {
        loop {
            if *stop.borrow() {
                return None;
            }
            let floor = self.shared.newest_acked();
            let api: Api<K> = self.shared.api(self.cursor.member);
            let lp = ListParams::default().labels(&self.labels);
            if let Answer::Ok(list) = self.shared.call("list", api.list(&lp)).await {
                if let Some(rv) = list
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<i64>().ok())
                {
                    let on = member(self.cursor.member);
                    let who = &self.who;
                    let seen = self.last_list.max(self.covered.load(Ordering::SeqCst));
                    if rv < seen {
                        self.shared.violation(
                            Violation::ListWentBack,
                            format!(
                                "{who}'s list on {on} was at version {rv} after it had seen {seen}"
                            ),
                        );
                    }
                    if rv < floor {
                        self.shared.violation(
                            Violation::StaleRead,
                            format!("{who}'s list on {on} was at version {rv}, older than the acknowledged {floor}"),
                        );
                    }
                    self.last_list = self.last_list.max(rv);
                    self.view.listed(&list.items, rv, &self.shared);
                    return Some(rv);
                }
            }
            self.cursor.next();
            if pause_or_stop(Duration::from_millis(200), stop).await {
                return None;
            }
        }
    }

    async fn watch<K>(&mut self, s: &mut Session, stop: &mut watch::Receiver<bool>) -> End
    where
        K: Watched,
        V: View<K>,
    {
        let api: Api<K> = self.shared.api(s.member);
        let wp = WatchParams::default().labels(&self.labels).timeout(60);
        let mut stream = match self
            .shared
            .call("watch", api.watch(&wp, &s.start.to_string()))
            .await
        {
            Answer::Ok(stream) => stream.boxed(),
            Answer::Gone => return End::Gone,
            _ => return End::Failed,
        };
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(WATCH_IDLE, stream.next()) => n,
                _ = stop.wait_for(|s| *s) => return End::Stopped,
            };
            let event = match next {
                Err(_) => {
                    self.shared.other_error(format!(
                        "watch on {}: nothing for {WATCH_IDLE:?}",
                        member(s.member)
                    ));
                    return End::Failed;
                }
                Ok(None) => return End::Closed,
                Ok(Some(Err(e))) => {
                    self.shared
                        .other_error(format!("watch on {}: {e}", member(s.member)));
                    return End::Failed;
                }
                Ok(Some(Ok(event))) => event,
            };
            let (deleted, object) = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => (false, o),
                WatchEvent::Deleted(o) => (true, o),
                WatchEvent::Bookmark(b) => {
                    let rv: i64 = b.metadata.resource_version.parse().unwrap_or(0);
                    let last = s.events.last().map_or(s.start, |e| e.0);
                    if rv < last {
                        self.shared.violation(
                            Violation::WatchOrder,
                            format!(
                                "{} on {}: a bookmark at {rv} after an event at {last}",
                                self.who,
                                member(s.member)
                            ),
                        );
                    }
                    s.covered = s.covered.max(rv);
                    self.covered.fetch_max(s.covered, Ordering::SeqCst);
                    continue;
                }
                WatchEvent::Error(status) => {
                    if status.code == 410 {
                        self.shared.stats.gone.fetch_add(1, Ordering::Relaxed);
                        return End::Gone;
                    }
                    self.shared.other_error(format!(
                        "watch on {}: ERROR {} {}",
                        member(s.member),
                        status.code,
                        status.message
                    ));
                    return End::Failed;
                }
            };
            let meta = object.meta();
            let name = meta.name.clone().unwrap_or_default();
            let rv = rv_of(meta).unwrap_or(0);
            let (who, on) = (&self.who, member(s.member));
            if s.events.is_empty() && rv <= s.start {
                self.shared.violation(
                    Violation::WatchResume,
                    format!(
                        "{who}'s watch from {} on {on} began with {name} at version {rv}",
                        s.start
                    ),
                );
            } else if rv <= s.covered {
                self.shared.violation(
                    Violation::WatchOrder,
                    format!(
                        "{who}'s watch from {} on {on}: {name} at version {rv} after {}",
                        s.start, s.covered
                    ),
                );
            }
            s.events.push((rv, name));
            s.covered = s.covered.max(rv);
            self.covered.fetch_max(s.covered, Ordering::SeqCst);
            self.view.event(deleted, &object, rv, &self.shared);
        }
    }
}

/// The ConfigMap watchers remember the tokens they see.
pub(super) struct Tokens;

impl View<ConfigMap> for Tokens {
    fn listed(&mut self, items: &[ConfigMap], _rv: i64, shared: &Shared) {
        for cm in items {
            shared.observe(cm);
        }
    }

    fn event(&mut self, _deleted: bool, cm: &ConfigMap, _rv: i64, shared: &Shared) {
        shared.observe(cm);
    }
}

/// Acknowledged writes that a watcher's sessions covered (after their start, up to the newest
/// version they vouched for) but did not deliver, or delivered as another object.
pub(super) fn gaps(who: &str, sessions: &[Session], acked: &BTreeMap<i64, String>) -> Vec<String> {
    let mut out = Vec::new();
    for s in sessions.iter().filter(|s| s.covered > s.start) {
        let seen: HashMap<i64, &str> = s.events.iter().map(|(rv, n)| (*rv, n.as_str())).collect();
        for (rv, name) in acked.range(s.start + 1..=s.covered) {
            match seen.get(rv) {
                Some(n) if n == name => {}
                Some(n) => out.push(format!(
                    "{who}'s watch from {} on {} delivered {n} at version {rv}, the acknowledged write of {name}",
                    s.start,
                    member(s.member)
                )),
                None => out.push(format!(
                    "{who}'s watch from {} on {} covered up to {} but skipped {name} at version {rv}",
                    s.start,
                    member(s.member),
                    s.covered
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(start: i64, covered: i64, events: &[(i64, &str)]) -> Session {
        Session {
            member: 0,
            start,
            covered,
            events: events.iter().map(|(r, n)| (*r, n.to_string())).collect(),
        }
    }

    #[test]
    fn gaps_are_acknowledged_writes_a_session_covered_but_did_not_deliver() {
        let acked: BTreeMap<i64, String> = [(11, "a"), (12, "b"), (14, "a"), (20, "c")]
            .into_iter()
            .map(|(r, n)| (r, n.to_string()))
            .collect();
        let cases: [(&str, Vec<Session>, usize); 7] = [
            (
                "a session that delivered nothing",
                vec![session(12, 12, &[])],
                0,
            ),
            (
                "everything delivered",
                vec![session(10, 14, &[(11, "a"), (12, "b"), (14, "a")])],
                0,
            ),
            (
                "a bookmark vouches for what it covers",
                vec![session(10, 15, &[(11, "a"), (12, "b")])],
                1,
            ),
            (
                "resumed without a gap",
                vec![
                    session(10, 12, &[(11, "a"), (12, "b")]),
                    session(12, 14, &[(14, "a")]),
                ],
                0,
            ),
            (
                "a range never covered (after 410) is not a gap",
                vec![session(10, 11, &[(11, "a")]), session(19, 20, &[(20, "c")])],
                0,
            ),
            (
                "a skipped write",
                vec![session(10, 20, &[(11, "a"), (14, "a"), (20, "c")])],
                1,
            ),
            (
                "the wrong object at an acknowledged version",
                vec![session(10, 12, &[(11, "a"), (12, "x")])],
                1,
            ),
        ];
        for (what, sessions, want) in cases {
            assert_eq!(gaps("w", &sessions, &acked).len(), want, "{what}");
        }
    }
}
