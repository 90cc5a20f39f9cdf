//! openraft's network: AppendEntries and Vote on the Raft stream to each peer (`stream`), and
//! InstallSnapshot and forwarded requests on one tonic channel per peer, both over mutual TLS
//! and carrying bincode payloads.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::commit_notice::{CommitNotices, Early};
use super::stream::{self, Kind, Link};
use super::wal::Wal;
use super::{Member, NodeId, SnapshotMetadata, TypeConfig, Vote};
use crate::proto::peer::peer_client::PeerClient;
use crate::proto::peer::Payload;

/// openraft's InstallSnapshot request as it travels between members: the same fields in the
/// same order, with the chunk's bytes written and read as one byte string. serde's `Vec<u8>`
/// goes one element at a time, and decoding the chunks that way took half of a follower's
/// CPU while it received a 200 MB snapshot (`perf`, 2026-12-07). bincode encodes both ways
/// alike, so the bytes on the wire are the same.
#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotChunk {
    vote: Vote,
    meta: SnapshotMetadata,
    offset: u64,
    #[serde(with = "crate::mvcc::byte_vec")]
    data: Vec<u8>,
    done: bool,
}

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(r: InstallSnapshotRequest<TypeConfig>) -> Self {
        SnapshotChunk {
            vote: r.vote,
            meta: r.meta,
            offset: r.offset,
            data: r.data,
            done: r.done,
        }
    }
}

impl From<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    fn from(c: SnapshotChunk) -> Self {
        InstallSnapshotRequest {
            vote: c.vote,
            meta: c.meta,
            offset: c.offset,
            data: c.data,
            done: c.done,
        }
    }
}

/// Builds peer channels. Cloned into openraft; every clone shares one lazily connected channel
/// per peer address.
///
/// openraft asks for a new client for every leadership check of a linearizable read, so the
/// channels are kept: a fresh channel would cost a TCP connect and a TLS handshake per read,
/// which on a loaded machine outlasts the heartbeat-long deadline of that check.
#[derive(Clone)]
pub struct PeerNetwork {
    tls: ClientTlsConfig,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    stream_tls: TlsConnector,
    links: Arc<Mutex<HashMap<String, Arc<Link>>>>,
    /// This member's log: the commit index sent to followers is held to what it has synced.
    log: Option<Arc<Wal>>,
    /// How long a follower's Success vouches for it to a commit notice (`commit_notice`);
    /// zero: every notice waits for the follower.
    vouch: Duration,
}

impl PeerNetwork {
    /// `tls` for the gRPC channels, `stream_tls` (offering [`stream::ALPN`]) for the Raft
    /// stream.
    pub fn new(tls: ClientTlsConfig, stream_tls: rustls::ClientConfig) -> Self {
        Self {
            tls,
            channels: Arc::default(),
            stream_tls: TlsConnector::from(Arc::new(stream_tls)),
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
    link: Arc<Link>,
    client: Result<PeerClient<Channel>, String>,
    log: Option<Arc<Wal>>,
    notices: CommitNotices,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> Self::Network {
        let client = self
            .channel(&node.peer_addr)
            .map(PeerClient::new)
            .map_err(|e| e.to_string());
        PeerConnection {
            target,
            link: self.link(&node.peer_addr),
            client,
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

impl PeerConnection {
    /// InstallSnapshot, on the gRPC channel.
    async fn install<Req, Resp, E>(&mut self, req: &Req, option: &RPCOption) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(
                    &std::io::Error::other(e.clone()),
                )))
            }
        };
        let data = bincode::serialize(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(Payload { data });
        request.set_timeout(option.hard_ttl());
        let reply =
            client
                .install_snapshot(request)
                .await
                .map_err(|status| match status.code() {
                    tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled => RPCError::Unreachable(Unreachable::new(&status)),
                    _ => RPCError::Network(NetworkError::new(&status)),
                })?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            bincode::deserialize(&reply.into_inner().data)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
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

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.install(&SnapshotChunk::from(rpc), &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        call(&self.link, self.target, Kind::Vote, &rpc, option.hard_ttl()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(data: Vec<u8>) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: Vote::new_committed(3, 7),
            meta: openraft::SnapshotMeta {
                last_log_id: Some(openraft::LogId::new(
                    openraft::CommittedLeaderId::new(3, 7),
                    4999,
                )),
                last_membership: Default::default(),
                snapshot_id: "3-4999-1".into(),
            },
            offset: 3 << 20,
            data,
            done: true,
        }
    }

    /// A chunk is encoded as openraft's request is, byte for byte, and reads back whole.
    #[test]
    fn a_snapshot_chunk_travels_as_openraft_s_request_does() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let theirs = bincode::serialize(&request(data.clone())).unwrap();
        let ours = bincode::serialize(&SnapshotChunk::from(request(data.clone()))).unwrap();
        assert_eq!(ours, theirs);
        let back: InstallSnapshotRequest<TypeConfig> =
            bincode::deserialize::<SnapshotChunk>(&theirs)
                .unwrap()
                .into();
        assert_eq!(back, request(data));
    }
}
