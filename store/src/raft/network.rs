//! openraft's network: AppendEntries and Vote on the Raft stream to each peer (`stream`),
//! snapshots whole on a connection of their own (`snapshot_stream`), and the elections'
//! forwarded requests on one tonic channel per peer, all over mutual TLS and carrying bincode
//! payloads.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest, VoteResponse};
use openraft::storage::Snapshot;
use openraft::OptionalSend;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::commit_notice::{CommitNotices, Early};
use super::snapshot_stream;
use super::stream::{self, Kind, Link};
use super::wal::Wal;
use super::{Member, NodeId, TypeConfig, Vote};

/// Builds peer connections. Cloned into openraft; every clone shares one Raft stream and one
/// lazily connected gRPC channel (the elections' calls) per peer address.
///
/// openraft asks for a new client for every leadership check of a linearizable read, so the
/// connections are kept: a fresh one would cost a TCP connect and a TLS handshake per read,
/// which on a loaded machine outlasts the heartbeat-long deadline of that check. A snapshot
/// gets a connection of its own each time (`snapshot_stream`).
#[derive(Clone)]
pub struct PeerNetwork {
    tls: ClientTlsConfig,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    stream_tls: TlsConnector,
    /// `stream_tls` offering [`snapshot_stream::ALPN`] instead.
    snapshot_tls: TlsConnector,
    links: Arc<Mutex<HashMap<String, Arc<Link>>>>,
    /// This member's log: the commit index sent to followers is held to what it has synced.
    log: Option<Arc<Wal>>,
    /// How long a follower's Success vouches for it to a commit notice (`commit_notice`);
    /// zero: every notice waits for the follower.
    vouch: Duration,
}

impl PeerNetwork {
    /// `tls` for the gRPC channels, `stream_tls` for the Raft stream and snapshot streams
    /// (the ALPN protocols it offers are replaced by each one's own).
    pub fn new(tls: ClientTlsConfig, stream_tls: rustls::ClientConfig) -> Self {
        let offering = |alpn: &[u8]| {
            let mut config = stream_tls.clone();
            config.alpn_protocols = vec![alpn.to_vec()];
            TlsConnector::from(Arc::new(config))
        };
        Self {
            tls,
            channels: Arc::default(),
            stream_tls: offering(stream::ALPN),
            snapshot_tls: offering(snapshot_stream::ALPN),
            links: Arc::default(),
            log: None,
            vouch: Duration::ZERO,
        }
    }

    /// The Raft stream to a peer address, shared by every clone.
    pub(crate) fn link(&self, addr: &str) -> Arc<Link> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links
            .entry(addr.to_string())
            .or_insert_with(|| Arc::new(Link::new(addr.to_string(), self.stream_tls.clone())))
            .clone()
    }

    /// Tells followers a commit index only up to what `log` has on stable storage. The leader
    /// counts itself in a quorum before its own sync (`LogStore::early_for_leader`); without
    /// this, a follower could apply an entry that only it holds durably, and after a power cut
    /// of the leader a new leader without it could replace it.
    pub fn holding_commit_to(self, log: Arc<Wal>) -> Self {
        Self {
            log: Some(log),
            ..self
        }
    }

    /// Answers the commit notices of replication at once when the follower's Success for a
    /// request sent within `heartbeat` vouches for them (`commit_notice`).
    pub fn answering_commit_notices(self, heartbeat: Duration) -> Self {
        Self {
            vouch: heartbeat,
            ..self
        }
    }

    /// The channel to a peer address (`host:port`), created on first use. A channel reconnects
    /// by itself after its connection drops.
    pub fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(self.tls.clone())?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

pub struct PeerConnection {
    target: NodeId,
    addr: String,
    link: Arc<Link>,
    snapshot_tls: TlsConnector,
    log: Option<Arc<Wal>>,
    notices: CommitNotices,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        PeerConnection {
            target,
            addr: node.peer_addr.clone(),
            link: self.link(&node.peer_addr),
            snapshot_tls: self.snapshot_tls.clone(),
            log: self.log.clone(),
            notices: CommitNotices::new(self.vouch),
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, Member, RaftError<NodeId, E>>>;

/// AppendEntries and Vote, on the Raft stream to `target`.
async fn call<Req, Resp, E>(
    link: &Link,
    target: NodeId,
    kind: Kind,
    req: &Req,
    ttl: Duration,
) -> RpcResult<Resp, E>
where
    Req: Serialize,
    Resp: DeserializeOwned,
    E: std::error::Error + DeserializeOwned,
{
    let data = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    let (outcome, reply) = link
        .call(kind, &data, ttl)
        .await
        .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
    if outcome != stream::ANSWERED {
        let why = String::from_utf8_lossy(&reply).into_owned();
        return Err(RPCError::Network(NetworkError::new(
            &std::io::Error::other(why),
        )));
    }
    let result: Result<Resp, RaftError<NodeId, E>> =
        bincode::deserialize(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
    result.map_err(|e| RPCError::RemoteError(RemoteError::new(target, e)))
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if let (Some(log), Some(commit)) = (&self.log, rpc.leader_commit) {
            rpc.leader_commit = log.durable_commit(commit);
        }
        let ttl = option.hard_ttl();
        match self.notices.early(&rpc, Instant::now()) {
            Early::Send => {}
            Early::Answer { response, arm } => {
                if arm {
                    let (link, target) = (self.link.clone(), self.target);
                    tokio::spawn(self.notices.clone().send_later(move |rpc| async move {
                        call(&link, target, Kind::Append, &rpc, ttl).await
                    }));
                }
                return Ok(response);
            }
        }
        let send = call(&self.link, self.target, Kind::Append, &rpc, ttl);
        self.notices.exchange(&rpc, send).await
    }

    /// The snapshot whole, on a connection of its own (`snapshot_stream`), instead of
    /// openraft's chunks.
    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> snapshot_stream::Sent {
        let send = snapshot_stream::send(
            &self.addr,
            self.target,
            &self.snapshot_tls,
            vote,
            snapshot,
            option.hard_ttl(),
        );
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            sent = send => sent,
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        call(&self.link, self.target, Kind::Vote, &rpc, option.hard_ttl()).await
    }
}
