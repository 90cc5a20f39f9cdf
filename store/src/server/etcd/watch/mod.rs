//! etcd's Watch service: many watchers multiplexed on one bidirectional stream, run by one
//! watcher set (`mvcc::watch`) per stream. Each stream encodes a revision's header and events
//! once for all its watchers ([`frame`]); [`server`] serves the frames on the wire.

mod frame;
mod server;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use frame::FrameCache;
pub use frame::WatchFrame;
pub use server::WatchServer;

use crate::mvcc::watch::{Refusal, SetMessage, WatchMessage, WatchSet, WatchSpec};
use crate::mvcc::KeyRange;
use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::watch_request::RequestUnion;
use crate::server::node::Node;

pub struct WatchService {
    pub node: Arc<Node>,
    /// Interval of progress notifications for watchers that ask for them (etcd: 10 minutes).
    pub progress_interval: Duration,
}

/// Responses a stream may have waiting for its client before its watchers wait too.
const STREAM_BUFFER: usize = 256;

type FrameStream = Pin<Box<dyn Stream<Item = Result<WatchFrame, Status>> + Send>>;

impl WatchService {
    /// Serves one Watch stream: its requests come in, its watchers' frames go out.
    fn watch(&self, request: Request<Streaming<pb::WatchRequest>>) -> Response<FrameStream> {
        let mut incoming = request.into_inner();
        let (out, rx) = mpsc::channel::<Result<WatchFrame, Status>>(STREAM_BUFFER);
        let node = self.node.clone();
        let progress_interval = self.progress_interval;
        let set = {
            let node = node.clone();
            let mut frames = FrameCache::default();
            WatchSet::start_sharing(node.mvcc.clone(), out, move |id, message| {
                Some(Ok(frame(&node, &mut frames, id, message)))
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
        Response::new(Box::pin(ReceiverStream::new(rx)))
    }
}

/// The etcd response for one message of a stream's watcher set; events come from the stream's
/// [`FrameCache`].
fn frame(node: &Node, frames: &mut FrameCache, id: i64, message: SetMessage) -> WatchFrame {
    let now = || node.header(node.mvcc.revision());
    let whole = |r: pb::WatchResponse| WatchFrame::whole(&r);
    match message {
        SetMessage::Shared { batch, prev_kv } => {
            let header = || node.header(batch.revision).unwrap_or_default();
            frames.shared(header, id, &batch, prev_kv)
        }
        SetMessage::Watch(WatchMessage::Events { revision, events }) => {
            let header = || node.header(revision).unwrap_or_default();
            frames.events(header, id, revision, events)
        }
        SetMessage::Created { revision } => whole(pb::WatchResponse {
            header: node.header(revision),
            watch_id: id,
            created: true,
            ..Default::default()
        }),
        SetMessage::Refused(refusal) => whole(pb::WatchResponse {
            header: now(),
            watch_id: id,
            created: true,
            canceled: true,
            cancel_reason: match refusal {
                Refusal::DuplicateId => "etcdserver: duplicate watch ID".into(),
                Refusal::Invalid(reason) => reason,
            },
            ..Default::default()
        }),
        SetMessage::Watch(WatchMessage::Progress { revision })
        | SetMessage::InSync { revision } => whole(pb::WatchResponse {
            header: node.header(revision),
            watch_id: id,
            ..Default::default()
        }),
        SetMessage::Watch(WatchMessage::Compacted { compact_revision }) => {
            whole(pb::WatchResponse {
                header: now(),
                watch_id: id,
                canceled: true,
                compact_revision,
                cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
                ..Default::default()
            })
        }
        SetMessage::Canceled { reason } => whole(pb::WatchResponse {
            header: now(),
            watch_id: id,
            canceled: true,
            cancel_reason: reason.unwrap_or_default(),
            ..Default::default()
        }),
    }
}
