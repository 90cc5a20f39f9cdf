//! The peer port: the Raft stream (AppendEntries and Vote, `raft::stream`), snapshot streams
//! (`raft::snapshot_stream`) and the gRPC peer service (the elections' forwarded requests),
//! told apart by each connection's ALPN protocol.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::{Request, Response, Status};

use super::node::{Forward, Node};
use crate::proto::peer::peer_server::Peer;
use crate::proto::peer::Payload;
use crate::raft::snapshot_stream;
use crate::raft::stream::{self, Kind};

/// Accepts peer connections until `stop`: a connection that asked for the Raft stream or a
/// snapshot stream is served here, any other (gRPC, `h2`) is handed to the tonic server through
/// `grpc`.
pub(super) async fn accept(
    node: Arc<Node>,
    listener: TcpListener,
    tls: TlsAcceptor,
    grpc: tokio::sync::mpsc::Sender<TlsStream<TcpStream>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let tcp = tokio::select! {
            _ = stopped(&mut stop) => return,
            c = listener.accept() => match c {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors and the like: let the condition pass.
                    tracing::warn!(error = %e, "peer port: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (node, tls, grpc, stop) = (node.clone(), tls.clone(), grpc.clone(), stop.clone());
        tokio::spawn(async move {
            let conn = match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "peer port: TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            match conn.get_ref().1.alpn_protocol() {
                Some(stream::ALPN) => serve_stream(node, conn, stop).await,
                Some(snapshot_stream::ALPN) => {
                    let ttl = Duration::from_millis(node.raft.config().install_snapshot_timeout);
                    let mut stop = stop;
                    tokio::select! {
                        _ = stopped(&mut stop) => {}
                        _ = snapshot_stream::serve(&node.raft, conn, ttl) => {}
                    }
                }
                _ => {
                    let _ = grpc.send(conn).await;
                }
            }
        });
    }
}

async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves one Raft stream connection: each request is answered by a task of its own, so a
/// heartbeat is not queued behind an append waiting for its fdatasync.
async fn serve_stream(
    node: Arc<Node>,
    conn: TlsStream<TcpStream>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let (mut reader, writer) = tokio::io::split(conn);
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    loop {
        let next = tokio::select! {
            _ = stopped(&mut stop) => return,
            f = stream::read_frame(&mut reader) => f,
        };
        let (id, tag, payload) = match next {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "Raft stream from a peer ended");
                return;
            }
        };
        let (node, writer) = (node.clone(), writer.clone());
        tokio::spawn(async move {
            let (outcome, body) = match answer(&node, tag, &payload).await {
                Ok(body) => (stream::ANSWERED, body),
                Err(why) => (stream::REFUSED, why.into_bytes()),
            };
            let bytes = stream::frame(id, outcome, &body);
            let mut w = writer.lock().await;
            if w.write_all(&bytes).await.is_ok() {
                let _ = w.flush().await;
            }
        });
    }
}

/// openraft's bincode-encoded result for one request, or why the request was not taken.
async fn answer(node: &Node, tag: u8, payload: &[u8]) -> Result<Vec<u8>, String> {
    let result = match Kind::from_tag(tag) {
        Some(Kind::Append) => {
            let req = bincode::deserialize(payload).map_err(undecodable)?;
            bincode::serialize(&node.raft.append_entries(req).await)
        }
        Some(Kind::Vote) => {
            let req = bincode::deserialize(payload).map_err(undecodable)?;
            bincode::serialize(&node.raft.vote(req).await)
        }
        Some(Kind::Forward) => {
            let req: Forward = bincode::deserialize(payload).map_err(undecodable)?;
            bincode::serialize(&node.serve_forward(req).await)
        }
        None => return Err(format!("unknown Raft stream request kind {tag}")),
    };
    result.map_err(|e| e.to_string())
}

pub struct PeerService(pub Arc<Node>);

fn decode<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, bincode::Error> {
    bincode::deserialize(&req.into_inner().data)
}

/// Why a peer's message, on the Raft stream or over gRPC, could not be read.
fn undecodable(e: bincode::Error) -> String {
    format!("undecodable peer message (is the peer running the same rkube version?): {e}")
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, bincode::Error> {
    bincode::serialize(value).map(|data| Response::new(Payload { data }))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req: Forward = decode(request).map_err(|e| Status::invalid_argument(undecodable(e)))?;
        reply(&self.0.serve_forward(req).await).map_err(|e| Status::internal(e.to_string()))
    }
}
