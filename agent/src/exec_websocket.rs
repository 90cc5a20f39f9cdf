//! exec and attach over a WebSocket with `v5.channel.k8s.io` (what kubectl 1.31+ and client-go's
//! WebSocket executor ask for), translated to SPDY toward the runtime's streaming server, which
//! speaks v5 neither over WebSocket nor at all: as kube-apiserver's stream translator does.
//!
//! Every WebSocket message is binary, its first byte a channel: 0 stdin, 1 stdout, 2 stderr,
//! 3 error (the command's metav1.Status), 4 resize (a terminal size as JSON), and 255 to close
//! one: `[255, 0]` ends stdin, which here is the stdin stream's FIN, so a command reading to
//! the end of its input (`kubectl exec -i ... < file`) sees it end. Each channel is one SPDY
//! stream of Kubernetes' v4 stream protocol (`streamtype` header).

use std::collections::HashMap;

use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use hyper::{Request, Response, StatusCode};
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;

use crate::spdy::{self, Frame};

use rkube_core::upgrade::EXEC_V5 as PROTOCOL;
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Which streams the command has, as its query asks.
#[derive(Debug, Clone, Copy)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Whether `req` is a WebSocket upgrade offering `protocol`.
pub fn wants<B>(req: &Request<B>, protocol: &str) -> bool {
    let upgrade = req
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
    upgrade && rkube_core::upgrade::offers(req.headers(), &[protocol])
}

pub(crate) type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;

/// The client's WebSocket, as this side answered it.
pub(crate) type ClientSocket =
    tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Answers the client's WebSocket handshake with `protocol` (the 101 returned) and runs
/// `session` on the WebSocket once the connection is upgraded.
pub(crate) fn accept<F, Fut>(
    req: &mut Request<hyper::body::Incoming>,
    protocol: &'static str,
    session: F,
) -> Result<Response<Body>, String>
where
    F: FnOnce(ClientSocket) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let key = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .ok_or("a WebSocket request without Sec-WebSocket-Key")?
        .to_string();
    let client = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(client) = client.await else {
            return;
        };
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(client),
            Role::Server,
            None,
        )
        .await;
        session(ws).await;
    });
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", protocol)
        .body(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed(),
        )
        .map_err(|e| e.to_string())
}

/// Opens the runtime's SPDY stream at `url`, answers the client's WebSocket handshake with v5
/// and relays between the two until the command ends. A runtime that refuses is the client's
/// error, not a switched protocol.
pub async fn serve(
    url: &str,
    streams: Streams,
    mut req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, String> {
    let runtime = open_runtime(url, "v4.channel.k8s.io").await?;
    tracing::info!(
        path = req.uri().path(),
        "a WebSocket stream with {PROTOCOL}, translated to SPDY toward the runtime"
    );
    accept(&mut req, PROTOCOL, move |ws| async move {
        if let Err(e) = relay(ws, runtime, streams).await {
            tracing::debug!("exec over WebSocket ended: {e}");
        }
    })
}

/// The runtime's streaming server, upgraded to SPDY/3.1 with `protocol` (Kubernetes' v4 stream
/// protocol for exec and attach, `portforward.k8s.io` for port-forward).
pub(crate) async fn open_runtime(
    url: &str,
    protocol: &str,
) -> Result<hyper::upgrade::Upgraded, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let (Some(authority), Some(path)) = (uri.authority(), uri.path_and_query()) else {
        return Err(format!("{url}: not an http URL"));
    };
    let tcp = tokio::net::TcpStream::connect(authority.as_str())
        .await
        .map_err(|e| format!("the runtime's streaming server at {url}: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let request = Request::post(path.as_str())
        .header("host", authority.as_str())
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", protocol)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let mut resp = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the runtime's streaming server at {url}: {e}"))?;
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let code = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(format!(
            "the runtime's streaming server answered {code}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    hyper::upgrade::on(&mut resp)
        .await
        .map_err(|e| e.to_string())
}

async fn relay<S>(
    mut ws: tokio_tungstenite::WebSocketStream<S>,
    runtime: hyper::upgrade::Upgraded,
    streams: Streams,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (read, write) = tokio::io::split(hyper_util::rt::TokioIo::new(runtime));
    let mut writer = spdy::Writer::new(write).map_err(|e| e.to_string())?;
    // The streams of Kubernetes' remote command protocol, in client-go's order; stderr is
    // folded into stdout on a terminal.
    let mut wanted = vec![("error", ERROR)];
    if streams.stdin {
        wanted.push(("stdin", STDIN));
    }
    if streams.stdout {
        wanted.push(("stdout", STDOUT));
    }
    if streams.stderr && !streams.tty {
        wanted.push(("stderr", STDERR));
    }
    if streams.tty {
        wanted.push(("resize", RESIZE));
    }
    let mut by_stream = HashMap::new();
    let mut by_channel = HashMap::new();
    for (i, (kind, channel)) in wanted.into_iter().enumerate() {
        let id = 2 * i as u32 + 1;
        writer
            .syn_stream(id, &[("streamtype", kind)])
            .await
            .map_err(|e| e.to_string())?;
        by_stream.insert(id, channel);
        by_channel.insert(channel, id);
    }
    // Frames are read on a task of their own, so the select below only waits on channels.
    let (frames_tx, mut frames) = tokio::sync::mpsc::channel(64);
    let reader = tokio::spawn(async move {
        let mut reader = spdy::Reader::new(read);
        loop {
            let frame = reader.next().await;
            let end = !matches!(frame, Ok(Some(_)));
            if frames_tx.send(frame).await.is_err() || end {
                return;
            }
        }
    });
    let outcome = loop {
        tokio::select! {
            frame = frames.recv() => match frame {
                Some(Ok(Some(Frame::Data { stream, data, .. }))) => {
                    let Some(&channel) = by_stream.get(&stream) else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    let mut message = Vec::with_capacity(data.len() + 1);
                    message.push(channel);
                    message.extend_from_slice(&data);
                    if let Err(e) = ws.send(Message::binary(message)).await {
                        break Err(e.to_string());
                    }
                }
                Some(Ok(Some(Frame::Ping(id)))) => {
                    if let Err(e) = writer.ping(id).await {
                        break Err(e.to_string());
                    }
                }
                Some(Ok(Some(Frame::Reset { stream, status }))) => {
                    break Err(format!("the runtime reset stream {stream} (status {status})"));
                }
                Some(Ok(Some(Frame::Other))) => {}
                // The command ended: the runtime sent its status and closed the connection.
                Some(Ok(Some(Frame::GoAway))) | Some(Ok(None)) | None => break Ok(()),
                Some(Err(e)) => break Err(e.to_string()),
            },
            message = ws.next() => match message {
                Some(Ok(Message::Binary(data))) => {
                    let Some((&channel, rest)) = data.split_first() else { continue };
                    let result = match channel {
                        CLOSE => match rest.first().and_then(|c| by_channel.get(c)) {
                            Some(&id) => writer.data(id, &[], true).await,
                            None => Ok(()),
                        },
                        STDIN | RESIZE => match by_channel.get(&channel) {
                            Some(&id) => writer.data(id, rest, false).await,
                            None => Ok(()),
                        },
                        _ => Ok(()),
                    };
                    if let Err(e) = result {
                        break Err(e.to_string());
                    }
                }
                Some(Ok(Message::Close(_))) | None => break Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(e.to_string()),
            },
        }
    };
    reader.abort();
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        }))
        .await;
    outcome
}
