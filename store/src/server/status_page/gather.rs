//! Gathering the report: each member's etcd `Status` (this member's own by a function call,
//! the others' over their etcd ports), the nodes from the [`NodeSource`](super::NodeSource),
//! and this member's history.

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::Utc;
use tonic::transport::{Channel, Endpoint};

use super::format::secs;
use super::report::{MemberRow, Nodes, Report, Role};
use super::StatusPage;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{StatusRequest, StatusResponse};
use crate::raft::NodeId;
use crate::server::history::SAMPLE_INTERVAL;

/// How long a member has to answer its Status.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

impl StatusPage {
    /// Asks the members for their status every sample interval until `stopped`, so that a
    /// member's last contact means something between page loads.
    pub async fn poll_members(self, stopped: impl Future<Output = ()>) {
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tick.tick() => {}
            }
            self.members().await;
        }
    }

    fn channel(&self, url: &str) -> Result<Channel, String> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(url) {
            return Ok(c.clone());
        }
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("bad client URL {url}: {e}"))?
            .connect_timeout(ASK_TIMEOUT)
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(self.inner.tls.clone())
                .map_err(|e| format!("TLS for {url}: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(url.to_string(), channel.clone());
        Ok(channel)
    }

    /// A member's Status: this member's own by a function call, another's over its etcd port.
    async fn ask(&self, id: NodeId, url: Option<&str>) -> Result<StatusResponse, String> {
        let request = || {
            let mut r = tonic::Request::new(StatusRequest {});
            r.set_timeout(ASK_TIMEOUT);
            r
        };
        if id == self.inner.node.id {
            let service =
                crate::server::etcd::maintenance::MaintenanceService(self.inner.node.clone());
            return service
                .status(request())
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string());
        }
        let url = url.ok_or("it has not published its client URLs yet")?;
        let mut client = MaintenanceClient::new(self.channel(url)?);
        match tokio::time::timeout(
            ASK_TIMEOUT + Duration::from_secs(1),
            client.status(request()),
        )
        .await
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(explain(&s)),
            Err(_) => Err(format!(
                "no answer within {}",
                secs(ASK_TIMEOUT.as_secs_f64())
            )),
        }
    }

    /// Every member of the membership (by name), each asked for its status at the same time.
    async fn members(&self) -> Vec<MemberRow> {
        let node = &self.inner.node;
        let metrics = node.raft.metrics().borrow().clone();
        let attrs = node.mvcc.member_attrs().unwrap_or_default();
        let voters: Vec<NodeId> = metrics.membership_config.voter_ids().collect();
        let matched = metrics.replication.clone().unwrap_or_default();
        let members: Vec<(NodeId, String)> = metrics
            .membership_config
            .nodes()
            .map(|(id, m)| (*id, m.peer_addr.clone()))
            .collect();
        let answers = futures::future::join_all(members.iter().map(|(id, _)| {
            let url = attrs.get(id).and_then(|a| a.client_urls.first().cloned());
            async move { self.ask(*id, url.as_deref()).await }
        }))
        .await;
        let now = Instant::now();
        let mut contacts = self
            .inner
            .contacts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<MemberRow> = members
            .into_iter()
            .zip(answers)
            .map(|((id, peer), answer)| {
                if answer.is_ok() {
                    contacts.insert(id, now);
                }
                let a = attrs.get(&id);
                let role = if metrics.current_leader == Some(id) {
                    Role::Leader
                } else if voters.contains(&id) {
                    Role::Follower
                } else {
                    Role::Learner
                };
                let (status, error) = match answer {
                    Ok(s) => (Some(s.into()), None),
                    Err(e) => (None, Some(e)),
                };
                MemberRow {
                    id: format!("{id:x}"),
                    name: a.map(|a| a.name.clone()).unwrap_or_default(),
                    peer_url: format!("https://{peer}"),
                    client_url: a.and_then(|a| a.client_urls.first().cloned()),
                    role,
                    this_member: id == node.id,
                    status,
                    error,
                    last_contact_seconds: contacts
                        .get(&id)
                        .map(|at| now.duration_since(*at).as_secs_f64()),
                    matched_index: matched.get(&id).map(|m| m.map_or(0, |l| l.index)),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.label().cmp(b.label()));
        rows
    }

    pub async fn report(&self) -> Report {
        let node = &self.inner.node;
        let members = self.members().await;
        let nodes = match self.inner.nodes.get() {
            None => Nodes::NotServed,
            Some(source) => match source.nodes().await {
                Ok(items) => Nodes::Listed { items },
                Err(error) => Nodes::Failed { error },
            },
        };
        let metrics = node.raft.metrics().borrow().clone();
        Report {
            member: node.name.clone(),
            member_id: format!("{:x}", node.id),
            cluster_id: format!("{:x}", node.cluster_id),
            generated_at: Utc::now(),
            term: metrics.current_term,
            leader: metrics.current_leader.map(|l| format!("{l:x}")),
            members,
            nodes,
            events: node.metrics.history.events(),
            samples: node.metrics.history.samples(),
            sample_interval_seconds: SAMPLE_INTERVAL.as_secs(),
        }
    }
}

/// A gRPC error as a sentence: its message and its root cause (a transport error's message
/// alone is "tcp connect error"; the cause says "Connection refused").
fn explain(status: &tonic::Status) -> String {
    let mut out = if status.message().is_empty() {
        format!("{:?}", status.code())
    } else {
        status.message().to_string()
    };
    let mut cause = None;
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        cause = Some(e.to_string());
        source = e.source();
    }
    if let Some(cause) = cause.filter(|c| !out.contains(c.as_str())) {
        out.push_str(": ");
        out.push_str(&cause);
    }
    out
}
