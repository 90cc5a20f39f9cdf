//! etcd's Watch service: many watchers multiplexed on one bidirectional stream.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::event_to_pb;
use crate::mvcc::watch::{self, Delivery, WatchMessage, WatchSpec};
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

/// Events a watcher may have buffered before it is considered slow and caught up from history.
const WATCHER_BUFFER: usize = 128;

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<Streaming<pb::WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let mut incoming = request.into_inner();
        let (out, rx) = mpsc::channel::<Result<pb::WatchResponse, Status>>(256);
        let node = self.node.clone();
        let progress_interval = self.progress_interval;
        tokio::spawn(async move {
            let mut watchers: HashMap<i64, (JoinHandle<()>, Arc<Delivery>)> = HashMap::new();
            let mut next_id: i64 = 0;
            while let Some(msg) = incoming.next().await {
                let Ok(msg) = msg else { break };
                match msg.request_union {
                    Some(RequestUnion::CreateRequest(create)) => {
                        watchers.retain(|_, (h, _)| !h.is_finished());
                        let id = if create.watch_id != 0 {
                            if watchers.contains_key(&create.watch_id) {
                                let _ = out
                                    .send(Ok(pb::WatchResponse {
                                        header: node.header(node.mvcc.revision()),
                                        watch_id: create.watch_id,
                                        created: true,
                                        canceled: true,
                                        cancel_reason: "etcdserver: duplicate watch ID".into(),
                                        ..Default::default()
                                    }))
                                    .await;
                                continue;
                            }
                            create.watch_id
                        } else {
                            while watchers.contains_key(&next_id) {
                                next_id += 1;
                            }
                            next_id
                        };
                        if create.key.is_empty() {
                            let _ = out
                                .send(Ok(pb::WatchResponse {
                                    header: node.header(node.mvcc.revision()),
                                    watch_id: id,
                                    created: true,
                                    canceled: true,
                                    cancel_reason: "etcdserver: key is not provided".into(),
                                    ..Default::default()
                                }))
                                .await;
                            continue;
                        }
                        let spec = WatchSpec {
                            range: KeyRange {
                                key: create.key,
                                range_end: create.range_end,
                            },
                            start_revision: create.start_revision,
                            prev_kv: create.prev_kv,
                            no_put: create
                                .filters
                                .contains(&(pb::watch_create_request::FilterType::Noput as i32)),
                            no_delete: create
                                .filters
                                .contains(&(pb::watch_create_request::FilterType::Nodelete as i32)),
                            progress_every: create.progress_notify.then_some(progress_interval),
                        };
                        let (rx, delivery) =
                            watch::start_tracked(node.mvcc.clone(), spec, WATCHER_BUFFER);
                        if out
                            .send(Ok(pb::WatchResponse {
                                header: node.header(node.mvcc.revision()),
                                watch_id: id,
                                created: true,
                                ..Default::default()
                            }))
                            .await
                            .is_err()
                        {
                            break;
                        }
                        let task = tokio::spawn(forward(
                            node.clone(),
                            id,
                            rx,
                            out.clone(),
                            delivery.clone(),
                        ));
                        watchers.insert(id, (task, delivery));
                    }
                    Some(RequestUnion::CancelRequest(cancel)) => {
                        if let Some((handle, _)) = watchers.remove(&cancel.watch_id) {
                            handle.abort();
                            let _ = out
                                .send(Ok(pb::WatchResponse {
                                    header: node.header(node.mvcc.revision()),
                                    watch_id: cancel.watch_id,
                                    canceled: true,
                                    ..Default::default()
                                }))
                                .await;
                        }
                    }
                    Some(RequestUnion::ProgressRequest(_)) => {
                        let deliveries: Vec<Arc<Delivery>> = watchers
                            .values()
                            .filter(|(h, _)| !h.is_finished())
                            .map(|(_, d)| d.clone())
                            .collect();
                        tokio::spawn(answer_progress(node.clone(), deliveries, out.clone()));
                    }
                    None => {}
                }
            }
            for (_, (h, _)) in watchers {
                h.abort();
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// How long a progress request waits for the stream's watchers to have passed on every event
/// up to the store's revision; etcd answers only when its watchers are in sync, and so does
/// this, waiting that long for them first.
const PROGRESS_WAIT: Duration = Duration::from_secs(1);

/// Answers a progress request (watch id -1) with the store's current revision once every
/// watcher of the stream has put every event up to it on the stream, so that no event at or
/// below the notified revision can follow the notification. Watchers still behind after
/// [`PROGRESS_WAIT`] (catching up from history, or a slow client): no answer, as etcd.
async fn answer_progress(
    node: Arc<Node>,
    watchers: Vec<Arc<Delivery>>,
    out: mpsc::Sender<Result<pb::WatchResponse, Status>>,
) {
    let revision = node.mvcc.revision();
    let deadline = tokio::time::Instant::now() + PROGRESS_WAIT;
    loop {
        let synced = watchers
            .iter()
            .all(|d| d.delivered().is_some_and(|p| p >= revision));
        if synced {
            let _ = out
                .send(Ok(pb::WatchResponse {
                    header: node.header(revision),
                    watch_id: -1,
                    ..Default::default()
                }))
                .await;
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Moves one watcher's messages onto the shared stream.
async fn forward(
    node: Arc<Node>,
    id: i64,
    mut rx: mpsc::Receiver<WatchMessage>,
    out: mpsc::Sender<Result<pb::WatchResponse, Status>>,
    delivery: Arc<Delivery>,
) {
    while let Some(msg) = rx.recv().await {
        let resp = match msg {
            WatchMessage::Events { revision, events } => pb::WatchResponse {
                header: node.header(revision),
                watch_id: id,
                events: events.into_iter().map(event_to_pb).collect(),
                ..Default::default()
            },
            WatchMessage::Progress { revision } => pb::WatchResponse {
                header: node.header(revision),
                watch_id: id,
                ..Default::default()
            },
            WatchMessage::Compacted { compact_revision } => pb::WatchResponse {
                header: node.header(node.mvcc.revision()),
                watch_id: id,
                canceled: true,
                compact_revision,
                cancel_reason: "etcdserver: mvcc: required revision has been compacted".into(),
                ..Default::default()
            },
        };
        if out.send(Ok(resp)).await.is_err() {
            return;
        }
        delivery.passed_one();
    }
}
