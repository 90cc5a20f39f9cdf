//! The gRPC service `etcdserverpb.Watch` by hand rather than tonic's generated server: the
//! generated one encodes a `WatchResponse` message per watcher, and this one writes the
//! [`WatchFrame`]s whose shared parts a stream encoded once. Requests are decoded as the
//! generated server decodes them; the wire is the same.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codec::ProstCodec;
use tonic::codegen::{empty_body, http, Body, BoxFuture, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Code, Request, Response, Status, Streaming};

use super::{FrameStream, WatchService};
use crate::proto::etcdserverpb as pb;

const WATCH_PATH: &str = "/etcdserverpb.Watch/Watch";

/// The Watch service for tonic's router.
#[derive(Clone)]
pub struct WatchServer(Arc<WatchService>);

impl WatchServer {
    pub fn new(service: WatchService) -> WatchServer {
        WatchServer(Arc::new(service))
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

/// The one method, `Watch`: a stream of requests answered by a stream of frames.
struct WatchMethod(Arc<WatchService>);

impl StreamingService<pb::WatchRequest> for WatchMethod {
    type Response = super::WatchFrame;
    type ResponseStream = FrameStream;
    type Future = BoxFuture<Response<FrameStream>, Status>;

    fn call(&mut self, request: Request<Streaming<pb::WatchRequest>>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { Ok(service.watch(request)) })
    }
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != WATCH_PATH {
            return Box::pin(async {
                let mut response = http::Response::new(empty_body());
                let headers = response.headers_mut();
                headers.insert(Status::GRPC_STATUS, (Code::Unimplemented as i32).into());
                headers.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(response)
            });
        }
        let method = WatchMethod(self.0.clone());
        Box::pin(async move {
            let codec = ProstCodec::<super::WatchFrame, pb::WatchRequest>::default();
            Ok(Grpc::new(codec).streaming(method, request).await)
        })
    }
}
