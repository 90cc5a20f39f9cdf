//! The controller manager: which controllers run during each term this member leads, and what
//! they are tuned with. `rkube_runtime::manager` runs them (and the scheduler, handed in as
//! another hook) while this member is the Raft leader.

use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_runtime::manager::{Manager, Term, TermHook};
use rkube_store::server::node::Node;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Namespace, Pod, ReplicationController, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::replicaset;

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
    /// The CA the API serves with (PEM), published in every namespace as `kube-root-ca.crt`;
    /// None: not published.
    pub root_ca: Option<String>,
    pub autoscaling: crate::podautoscaler::Settings,
    /// The pod garbage collector's period and terminated-pod threshold.
    pub pod_gc: crate::podgc::Settings,
}

/// Runs the controllers, then `hooks` (the scheduler), during every term this member leads.
pub fn start(
    node: Arc<Node>,
    client: LocalClient,
    settings: Settings,
    hooks: Vec<TermHook>,
) -> Manager {
    let controllers: TermHook = {
        let node = node.clone();
        Arc::new(move |term: &mut Term| start_term(&node, term, settings.clone()))
    };
    let all = std::iter::once(controllers).chain(hooks).collect();
    rkube_runtime::manager::start(node, client, all)
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node_lifecycle: Default::default(),
            compaction_interval: Duration::from_secs(300),
            certificates: None,
            load_balancer_pool: None,
            root_ca: None,
            autoscaling: Default::default(),
            pod_gc: Default::default(),
        }
    }
}

/// Starts every controller of one term on the term's informers.
fn start_term(node: &Arc<Node>, term: &mut Term, settings: Settings) {
    let (client, rx, raft_term) = (term.client, term.stop.clone(), term.raft_term);
    let inf = &mut term.informers;
    let pods = inf.of("/registry/pods/").typed::<Pod>();
    let replicasets = inf.of("/registry/replicasets/").typed::<ReplicaSet>();
    replicaset::start(
        replicasets.clone(),
        pods.clone(),
        client.clone(),
        rx.clone(),
    );
    replicaset::start(
        inf.of("/registry/controllers/")
            .typed::<ReplicationController>(),
        pods.clone(),
        client.clone(),
        rx.clone(),
    );
    crate::deployment::start(
        inf.of("/registry/deployments/").typed::<Deployment>(),
        replicasets.clone(),
        pods.clone(),
        client.clone(),
        rx.clone(),
    );
    crate::disruption::start(
        inf.of("/registry/poddisruptionbudgets/")
            .typed::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(),
        pods.clone(),
        crate::disruption::Scales {
            deployments: inf.of("/registry/deployments/").typed::<Deployment>(),
            replicasets: replicasets.clone(),
            controllers: inf
                .of("/registry/controllers/")
                .typed::<ReplicationController>(),
            statefulsets: inf
                .of("/registry/statefulsets/")
                .typed::<k8s_openapi::api::apps::v1::StatefulSet>(),
        },
        client.clone(),
        rx.clone(),
    );
    crate::daemonset::start(
        inf.of("/registry/daemonsets/").typed::<DaemonSet>(),
        inf.of("/registry/minions/")
            .typed::<k8s_openapi::api::core::v1::Node>(),
        pods.clone(),
        inf.of("/registry/controllerrevisions/")
            .typed::<ControllerRevision>(),
        client.clone(),
        rx.clone(),
    );
    crate::statefulset::start(
        inf.of("/registry/statefulsets/")
            .typed::<k8s_openapi::api::apps::v1::StatefulSet>(),
        pods.clone(),
        inf.of("/registry/persistentvolumeclaims/")
            .typed::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(),
        inf.of("/registry/controllerrevisions/")
            .typed::<ControllerRevision>(),
        client.clone(),
        rx.clone(),
    );
    crate::podautoscaler::start(
        inf.of("/registry/horizontalpodautoscalers/")
            .typed::<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler>(),
        pods.clone(),
        client.clone(),
        rx.clone(),
        settings.autoscaling.clone(),
    );
    let jobs = inf.of("/registry/jobs/").typed::<Job>();
    crate::job::start(jobs.clone(), pods.clone(), client.clone(), rx.clone());
    crate::cronjob::start(
        inf.of("/registry/cronjobs/").typed::<CronJob>(),
        jobs,
        client.clone(),
        rx.clone(),
    );
    let services = inf.of("/registry/services/specs/").typed::<Service>();
    crate::endpoints::start(
        services.clone(),
        pods.clone(),
        inf.of("/registry/services/endpoints/").typed::<Endpoints>(),
        inf.of("/registry/endpointslices/").typed::<EndpointSlice>(),
        client.clone(),
        rx.clone(),
    );
    let node_controller = crate::nodelifecycle::Controller::new(
        inf.of("/registry/minions/")
            .typed::<k8s_openapi::api::core::v1::Node>(),
        inf.of("/registry/leases/")
            .typed::<k8s_openapi::api::coordination::v1::Lease>(),
        pods.clone(),
        client.clone(),
        settings.node_lifecycle,
    );
    let followed = crate::garbagecollector::followed()
        .into_iter()
        .map(|res| (res, inf.of(&res.prefix(None))))
        .collect();
    let collector = crate::garbagecollector::Collector::new(followed, client.clone());
    if let Some(certs) = settings.certificates.clone() {
        crate::certificates::start_csr(
            inf.of("/registry/certificatesigningrequests/")
                .typed::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>(),
            client.clone(),
            certs.clone(),
            rx.clone(),
        );
        crate::certificates::start_bootstrap_signer(
            inf.of("/registry/secrets/").typed::<Secret>(),
            inf.of("/registry/configmaps/").typed::<ConfigMap>(),
            client.clone(),
            certs,
            rx.clone(),
        );
        crate::certificates::start_token_cleaner(
            inf.of("/registry/secrets/").typed::<Secret>(),
            client.clone(),
            rx.clone(),
        );
    }
    if let Some(ca) = settings.root_ca.clone() {
        crate::rootcacert::start(
            inf.of("/registry/namespaces/").typed::<Namespace>(),
            inf.of("/registry/configmaps/").typed::<ConfigMap>(),
            client.clone(),
            ca,
            rx.clone(),
        );
    }
    if let Some(pool) = settings.load_balancer_pool.clone() {
        crate::loadbalancer::run(services, client.clone(), pool, rx.clone());
    }
    crate::volume::start(
        inf.of("/registry/persistentvolumeclaims/")
            .typed::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(),
        inf.of("/registry/persistentvolumes/")
            .typed::<k8s_openapi::api::core::v1::PersistentVolume>(),
        inf.of("/registry/storageclasses/")
            .typed::<k8s_openapi::api::storage::v1::StorageClass>(),
        inf.of("/registry/pods/").typed::<Pod>(),
        inf.of("/registry/minions/")
            .typed::<k8s_openapi::api::core::v1::Node>(),
        client.clone(),
        rx.clone(),
    );
    {
        let client = client.clone();
        tokio::spawn(async move {
            if let Err(e) = crate::volume::localpath::ensure_class(&client).await {
                tracing::warn!(error = %e, "the default StorageClass local-path was not made");
            }
        });
    }
    crate::podgc::run(
        pods.clone(),
        inf.of("/registry/minions/")
            .typed::<k8s_openapi::api::core::v1::Node>(),
        client.clone(),
        settings.pod_gc.clone(),
        rx.clone(),
    );
    crate::compaction::run(
        node.clone(),
        raft_term,
        settings.compaction_interval,
        rx.clone(),
    );
    collector.run(rx.clone());
    node_controller.run(rx);
}
