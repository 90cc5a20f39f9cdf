//! Runs what was handed to it (the controllers, the scheduler) while this member is the Raft
//! leader, and stops it when it is not. A new term first waits until the member has applied
//! everything committed (a read-index barrier), so the informers start from the newest state.
//!
//! # Correctness
//! No lease is needed: every write made through the term's client is a Raft proposal fenced to
//! the term, which a deposed leader cannot commit, and every informer reads the member's own
//! applied state.

use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_store::server::node::Node;
use tokio::sync::watch;

use crate::informer::Informer;

/// How often leadership is checked.
const LEADERSHIP_POLL: Duration = Duration::from_millis(100);

/// One term this member leads, as each [`TermHook`] gets it.
pub struct Term<'a> {
    /// The term's shared informers: take what you read before the hooks return; they start
    /// once every hook has run.
    pub informers: Informers,
    /// A client whose writes are fenced to this term.
    pub client: &'a LocalClient,
    /// Becomes true when the term ends for this member.
    pub stop: watch::Receiver<bool>,
    /// The Raft term.
    pub raft_term: u64,
}

/// What runs during each term: registers its informers and starts its workers, which end with
/// `stop`.
pub type TermHook = Arc<dyn Fn(&mut Term) + Send + Sync>;

/// The shared informers of one term, one per store folder, made on first use.
#[derive(Default)]
pub struct Informers {
    all: Vec<Arc<Informer>>,
}

impl Informers {
    pub fn of(&mut self, folder: &str) -> Arc<Informer> {
        if let Some(i) = self.all.iter().find(|i| i.prefix() == folder) {
            return i.clone();
        }
        let i = Informer::new(folder);
        self.all.push(i.clone());
        i
    }
}

pub struct Manager {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Manager {
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Runs `hooks` for every term this member leads, in their order, with fresh informers.
pub fn start(node: Arc<Node>, client: LocalClient, hooks: Vec<TermHook>) -> Manager {
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        // The running term: the Raft term it was started in, and its stop switch.
        let mut term: Option<(u64, watch::Sender<bool>)> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(LEADERSHIP_POLL) => {}
                _ = stopped.changed() => break,
            }
            let leading = node.is_leader();
            // Leadership lost, or lost and won again in a later term between two looks: the
            // running term's work belongs to a term this member no longer leads.
            if term
                .as_ref()
                .is_some_and(|(t, _)| !leading || node.term() != *t)
            {
                tracing::info!("no longer leading that term: stopping the controllers");
                if let Some((_, stop)) = term.take() {
                    let _ = stop.send(true);
                }
            }
            if leading && term.is_none() {
                if let Err(e) = node.linearizable_barrier().await {
                    tracing::debug!(error = %e, "leader not settled yet; controllers wait");
                    continue;
                }
                let t = node.term();
                tracing::info!(term = t, "leading: starting the controllers");
                // Everything this term's hooks write is fenced to the term.
                let stop = start_term(&node, &client.fenced(t), &hooks, t);
                term = Some((t, stop));
            }
        }
        if let Some((_, stop)) = term.take() {
            let _ = stop.send(true);
        }
    });
    Manager { stop, task }
}

/// Runs every hook with fresh informers, then starts the informers; all stop when the returned
/// sender sends true.
fn start_term(
    node: &Arc<Node>,
    client: &LocalClient,
    hooks: &[TermHook],
    raft_term: u64,
) -> watch::Sender<bool> {
    let (tx, rx) = watch::channel(false);
    let mut term = Term {
        informers: Informers::default(),
        client,
        stop: rx.clone(),
        raft_term,
    };
    for hook in hooks {
        hook(&mut term);
    }
    for informer in term.informers.all {
        tokio::spawn(informer.run(node.clone(), rx.clone()));
    }
    tx
}
