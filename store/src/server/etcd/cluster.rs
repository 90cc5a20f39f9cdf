//! etcd's Cluster service: membership through openraft (learners, promotion, removal).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::status;
use crate::error::StoreError;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::cluster_server::Cluster;
use crate::raft::Member;
use crate::server::node::{member_id, MembershipChange, Node};

pub struct ClusterService(pub Arc<Node>);

/// `https://host:port` or `host:port` -> `host:port`.
pub fn peer_addr_of(url: &str) -> Result<String, StoreError> {
    let addr = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .unwrap_or(url);
    let addr = addr.trim_end_matches('/');
    if addr.is_empty() || !addr.contains(':') {
        return Err(StoreError::InvalidArgument(format!(
            "invalid peer URL {url:?}: expected https://host:port"
        )));
    }
    Ok(addr.to_string())
}

/// The members as etcd lists them: voters and learners with their published attributes.
pub fn member_list(node: &Node) -> Result<Vec<pb::Member>, StoreError> {
    let membership = node.raft.metrics().borrow().membership_config.clone();
    let attrs = node.mvcc.member_attrs()?;
    let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
    let mut out = Vec::new();
    for (id, member) in membership.nodes() {
        let a = attrs.get(id);
        out.push(pb::Member {
            id: *id,
            name: a.map(|a| a.name.clone()).unwrap_or_default(),
            peer_ur_ls: vec![format!("https://{}", member.peer_addr)],
            client_ur_ls: a.map(|a| a.client_urls.clone()).unwrap_or_default(),
            is_learner: !voters.contains(id),
        });
    }
    Ok(out)
}

impl ClusterService {
    fn members(&self) -> Result<Vec<pb::Member>, StoreError> {
        member_list(&self.0)
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        self.0.header(self.0.mvcc.revision())
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let req = request.into_inner();
        let url = req
            .peer_ur_ls
            .first()
            .ok_or_else(|| Status::invalid_argument("etcdserver: member add needs a peer URL"))?;
        let addr = peer_addr_of(url)?;
        let id = member_id(&self.0.identity.cluster_token, &addr);
        let member = Member { peer_addr: addr };
        let change = if req.is_learner {
            MembershipChange::AddLearner { id, member }
        } else {
            MembershipChange::AddVoter { id, member }
        };
        self.0.change_membership(change).await.map_err(status)?;
        let mut members = self.members()?;
        // A member that forwarded the change to the leader may not have applied it yet: the
        // answer names the new member all the same (etcdctl builds its initial cluster from it).
        let added = match members.iter().find(|m| m.id == id) {
            Some(m) => m.clone(),
            None => {
                let m = pb::Member {
                    id,
                    peer_ur_ls: vec![url.clone()],
                    is_learner: req.is_learner,
                    ..Default::default()
                };
                members.push(m.clone());
                m
            }
        };
        let added = Some(added);
        Ok(Response::new(pb::MemberAddResponse {
            header: self.header(),
            member: added,
            members,
        }))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        let id = request.into_inner().id;
        self.0
            .change_membership(MembershipChange::Remove { id })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header: self.header(),
            members: self.members()?,
        }))
    }

    async fn member_update(
        &self,
        request: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        let req = request.into_inner();
        let url = req.peer_ur_ls.first().ok_or_else(|| {
            Status::invalid_argument("etcdserver: member update needs a peer URL")
        })?;
        let member = Member {
            peer_addr: peer_addr_of(url)?,
        };
        self.0
            .change_membership(MembershipChange::Update { id: req.id, member })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header: self.header(),
            members: self.members()?,
        }))
    }

    async fn member_list(
        &self,
        request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        if request.into_inner().linearizable {
            self.0.linearizable_barrier().await.map_err(status)?;
        }
        Ok(Response::new(pb::MemberListResponse {
            header: self.header(),
            members: self.members()?,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        let id = request.into_inner().id;
        self.0
            .change_membership(MembershipChange::Promote { id })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header(),
            members: self.members()?,
        }))
    }
}
