//! The controller manager: runs the controllers while this member is the Raft leader, and stops
//! them when it is not. A new term first waits until the member has applied everything
//! committed (a read-index barrier), so the informers start from the newest state.
//!
//! # Correctness
//! No lease is needed: every write a controller makes is a Raft proposal, which a deposed leader
//! cannot commit, and every informer reads the member's own applied state.

use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_store::server::node::Node;
use tokio::sync::watch;

use crate::informer::Informer;
use crate::replicaset::{self, REPLICATION_CONTROLLER, REPLICA_SET};

/// How often leadership is checked.
const LEADERSHIP_POLL: Duration = Duration::from_millis(100);

pub struct ControllerManager {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ControllerManager {
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// What the controllers are tuned with (kube-controller-manager's flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The CSR approver and signer and the bootstrap signer, when this member has the CA key.
    pub certificates: Option<crate::certificates::Settings>,
    pub node_lifecycle: crate::nodelifecycle::Settings,
    /// How often the leader compacts the store's history (kube-apiserver's
    /// --etcd-compaction-interval, 5 minutes; zero: never).
    pub compaction_interval: Duration,
    /// Addresses for LoadBalancer Services (`--load-balancer-ip-range`); None: they stay
    /// pending.
    pub load_balancer_pool: Option<crate::loadbalancer::Pool>,
}

pub fn start(
    node: Arc<Node>,
    client: LocalClient,
    settings: Settings,
    hooks: Vec<TermHook>,
) -> ControllerManager {
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
            // running controllers belong to a term this member no longer leads.
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
                // Everything this term's controllers write is fenced to the term.
                let stop = start_term(&node, &client.fenced(t), settings.clone(), &hooks, t);
                term = Some((t, stop));
            }
        }
        if let Some((_, stop)) = term.take() {
            let _ = stop.send(true);
        }
    });
    ControllerManager { stop, task }
}

/// The shared informers of one term, one per store folder, made on first use.
#[derive(Default)]
pub struct Informers {
    all: Vec<Arc<Informer>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node_lifecycle: Default::default(),
            compaction_interval: Duration::from_secs(300),
            certificates: None,
            load_balancer_pool: None,
        }
    }
}

/// More to run during each term, beside the controllers (the scheduler): it takes the term's
/// informers (registering its handlers before they start), a client, and the term's stop.
pub type TermHook = Arc<dyn Fn(&mut Informers, &LocalClient, watch::Receiver<bool>) + Send + Sync>;

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

/// Starts every controller with fresh informers; they all stop when the returned sender sends
/// true.
fn start_term(
    node: &Arc<Node>,
    client: &LocalClient,
    settings: Settings,
    hooks: &[TermHook],
    raft_term: u64,
) -> watch::Sender<bool> {
    let (tx, rx) = watch::channel(false);
    let mut inf = Informers::default();
    let pods = inf.of("/registry/pods/");
    let replicasets = inf.of("/registry/replicasets/");
    let rs_controller = replicaset::Controller::new(
        REPLICA_SET,
        replicasets.clone(),
        pods.clone(),
        client.clone(),
    );
    let rc_controller = replicaset::Controller::new(
        REPLICATION_CONTROLLER,
        inf.of("/registry/controllers/"),
        pods.clone(),
        client.clone(),
    );
    let deployment_controller = crate::deployment::Controller::new(
        inf.of("/registry/deployments/"),
        replicasets,
        pods.clone(),
        client.clone(),
    );
    let endpoints_controller = crate::endpoints::Controller::new(
        inf.of("/registry/services/specs/"),
        pods,
        inf.of("/registry/services/endpoints/"),
        inf.of("/registry/endpointslices/"),
        client.clone(),
    );
    let node_controller = crate::nodelifecycle::Controller::new(
        inf.of("/registry/minions/"),
        inf.of("/registry/leases/"),
        inf.of("/registry/pods/"),
        client.clone(),
        settings.node_lifecycle,
    );
    let followed: Vec<Arc<Informer>> = crate::garbagecollector::FOLLOWED
        .iter()
        .map(|(folder, _, _)| inf.of(folder))
        .collect();
    let collector = crate::garbagecollector::Collector::new(followed, client.clone());
    if let Some(certs) = settings.certificates.clone() {
        crate::certificates::CsrController::new(
            inf.of("/registry/certificatesigningrequests/"),
            client.clone(),
            certs.clone(),
        )
        .run(rx.clone());
        crate::certificates::BootstrapController::new(
            inf.of("/registry/secrets/"),
            inf.of("/registry/configmaps/"),
            client.clone(),
            certs,
        )
        .run(rx.clone());
    }
    if let Some(pool) = settings.load_balancer_pool.clone() {
        crate::loadbalancer::run(
            inf.of("/registry/services/specs/"),
            client.clone(),
            pool,
            rx.clone(),
        );
    }
    crate::podgc::run(
        inf.of("/registry/pods/"),
        inf.of("/registry/minions/"),
        client.clone(),
        crate::podgc::CHECK_PERIOD,
        rx.clone(),
    );
    for hook in hooks {
        hook(&mut inf, client, rx.clone());
    }
    crate::compaction::run(
        node.clone(),
        raft_term,
        settings.compaction_interval,
        rx.clone(),
    );
    for informer in inf.all {
        tokio::spawn(informer.run(node.clone(), rx.clone()));
    }
    collector.run(rx.clone());
    rs_controller.run(rx.clone());
    rc_controller.run(rx.clone());
    deployment_controller.run(rx.clone());
    endpoints_controller.run(rx.clone());
    node_controller.run(rx);
    tx
}
