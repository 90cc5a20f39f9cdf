//! etcd's Watch service: many watchers multiplexed on one bidirectional stream, run by one
//! watcher set (`mvcc::watch`) per stream.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::event_to_pb;
use crate::mvcc::watch::{Refusal, SetMessage, WatchMessage, WatchSet, WatchSpec};
use crate::mvcc::KeyRange;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::proto::etcdserverpb::watch_server::Watch;
use crate::server::node::Node;

pub struct WatchService {
    pub node: Arc<Node>,
    /// Interval of progress notifications for watchers that ask for them (etcd: 10 minutes).
    pub progress_interval: Duration,
}

/// Responses a stream may have waiting for its client before its watchers wait too.
const STREAM_BUFFER: usize = 256;

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let mut incoming = request.into_inner();
        let (out, rx) = mpsc::channel::<Result<pb::WatchResponse, Status>>(STREAM_BUFFER);
        let node = self.node.clone();
        let progress_interval = self.progress_interval;
        let set = {
            let node = node.clone();
            WatchSet::start(node.mvcc.clone(), out, move |id, message| {
                Some(Ok(response(&node, id, message)))
            })
        };
        tokio::spawn(async move {
            // The set ends with this task: when the client closes its side of the stream.
            while let Some(Ok(msg)) = incoming.next().await {
                let sent = match msg.request_union {
                    Some(RequestUnion::CreateRequest(create)) => {
                        let spec = if create.key.is_empty() {
                            Err("etcdserver: key is not provided".to_string())
                        } else {
                            Ok(WatchSpec {
                                range: KeyRange {
                                    key: create.key,
                                    range_end: create.range_end,
                                },
                                start_revision: create.start_revision,
                                prev_kv: create.prev_kv,
                                no_put: create.filters.contains(
                                    &(pb::watch_create_request::FilterType::Noput as i32),
                                ),
                                no_delete: create.filters.contains(
                                    &(pb::watch_create_request::FilterType::Nodelete as i32),
                                ),
                                progress_every: create.progress_notify.then_some(progress_interval),
                            })
                        };
                        set.add(create.watch_id, spec).await
                    }
                    Some(RequestUnion::CancelRequest(cancel)) => set.cancel(cancel.watch_id).await,
                    Some(RequestUnion::ProgressRequest(_)) => set.request_progress().await,
                    None => true,
                };
                if !sent {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// The etcd response for one message of a stream's watcher set.
fn response(node: &Node, id: i64, message: SetMessage) -> pb::WatchResponse {
    let now = || node.header(node.mvcc.revision());
    match message {
        SetMessage::Created { revision } => pb::WatchResponse {
            header: node.header(revision),
            watch_id: id,
            created: true,
            ..Default::default()
        },
        SetMessage::Refused(refusal) => pb::WatchResponse {
            header: now(),
            watch_id: id,
            created: true,
            canceled: true,
            cancel_reason: match refusal {
                Refusal::DuplicateId => "etcdserver: duplicate watch ID".into(),
                Refusal::Invalid(reason) => reason,
            },
            ..Default::default()
        },
        SetMessage::Watch(WatchMessage::Events { revision, events }) => pb::WatchResponse {
            header: node.header(revision),
            watch_id: id,
            events: events.into_iter().map(event_to_pb).collect(),
            ..Default::default()
        },
        SetMessage::Watch(WatchMessage::Progress { revision })
        | SetMessage::InSync { revision } => pb::WatchResponse {
            header: node.header(revision),
            watch_id: id,
            ..Default::default()
        },
        SetMessage::Watch(WatchMessage::Compacted { compact_revision }) => pb::WatchResponse {
            header: now(),
            watch_id: id,
            canceled: true,
            compact_revision,
            cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
            ..Default::default()
        },
        SetMessage::Canceled { reason } => pb::WatchResponse {
            header: now(),
            watch_id: id,
            canceled: true,
            cancel_reason: reason.unwrap_or_default(),
            ..Default::default()
        },
    }
}
