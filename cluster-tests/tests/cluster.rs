//! Multi-process scenarios against real `rkube server` processes started through `rkube up`.
//! Each test tells one story; the harness kills every process it started when the test ends.
//! The suites are the modules below, each named for what it tests; `common` holds the helpers
//! several of them share.

#[path = "cluster/agent.rs"]
mod agent;
#[path = "cluster/autoscaling.rs"]
mod autoscaling;
#[path = "cluster/backup.rs"]
mod backup;
#[path = "cluster/certificates.rs"]
mod certificates;
#[path = "cluster/chaos.rs"]
mod chaos;
#[path = "cluster/chaos_k8s.rs"]
mod chaos_k8s;
#[path = "cluster/common.rs"]
mod common;
#[path = "cluster/controllers.rs"]
mod controllers;
#[path = "cluster/daemonsets.rs"]
mod daemonsets;
#[path = "cluster/data_dir.rs"]
mod data_dir;
#[path = "cluster/deploy.rs"]
mod deploy;
#[path = "cluster/disruption.rs"]
mod disruption;
#[path = "cluster/etcd_client.rs"]
mod etcd_client;
#[path = "cluster/etcdctl.rs"]
mod etcdctl;
#[path = "cluster/failover.rs"]
mod failover;
#[path = "cluster/jobs.rs"]
mod jobs;
#[path = "cluster/kube_client.rs"]
mod kube_client;
#[path = "cluster/kubectl.rs"]
mod kubectl;
#[path = "cluster/maintenance.rs"]
mod maintenance;
#[path = "cluster/membership.rs"]
mod membership;
#[path = "cluster/rbac.rs"]
mod rbac;
#[path = "cluster/recovery.rs"]
mod recovery;
#[path = "cluster/replication.rs"]
mod replication;
#[path = "cluster/scheduler.rs"]
mod scheduler;
#[path = "cluster/service_accounts.rs"]
mod service_accounts;
#[path = "cluster/services.rs"]
mod services;
#[path = "cluster/snapshots.rs"]
mod snapshots;
#[path = "cluster/statefulsets.rs"]
mod statefulsets;
#[path = "cluster/status_page.rs"]
mod status_page;
#[path = "cluster/storage.rs"]
mod storage;
#[path = "cluster/stored_kinds.rs"]
mod stored_kinds;
#[path = "cluster/streams.rs"]
mod streams;
#[path = "cluster/watch.rs"]
mod watch;
