//! The peer service: openraft's RPCs and forwarded requests from followers.

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::node::{Forward, Node};
use crate::proto::peer::peer_server::Peer;
use crate::proto::peer::Payload;

pub struct PeerService(pub Arc<Node>);

fn decode<T: DeserializeOwned>(req: Request<Payload>) -> Result<T, Status> {
    bincode::deserialize(&req.into_inner().data).map_err(|e| {
        Status::invalid_argument(format!(
            "undecodable peer message (is the peer running the same rkube version?): {e}"
        ))
    })
}

fn reply<T: Serialize>(value: &T) -> Result<Response<Payload>, Status> {
    bincode::serialize(value)
        .map(|data| Response::new(Payload { data }))
        .map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn append_entries(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = decode(request)?;
        reply(&self.0.raft.append_entries(req).await)
    }

    async fn vote(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req = decode(request)?;
        reply(&self.0.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<Payload>,
    ) -> Result<Response<Payload>, Status> {
        let req = decode(request)?;
        reply(&self.0.raft.install_snapshot(req).await)
    }

    async fn forward(&self, request: Request<Payload>) -> Result<Response<Payload>, Status> {
        let req: Forward = decode(request)?;
        reply(&self.0.serve_forward(req).await)
    }
}
