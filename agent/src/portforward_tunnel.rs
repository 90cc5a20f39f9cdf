//! kubectl's port-forward over a WebSocket (`SPDY/3.1+portforward.k8s.io`, kubectl 1.31+'s
//! default, client-go's tunneling dialer): the client runs an ordinary SPDY/3.1 port-forward
//! session (`portforward.k8s.io`: a data and an error stream per connection, each naming its
//! port and request id in its headers) and carries its bytes, as they are, in binary WebSocket
//! messages. The runtime's streaming server speaks that SPDY session but not the tunnel, so the
//! agent answers the WebSocket and joins it with a SPDY upgrade toward the runtime: each binary
//! message's payload is written to the runtime, and what the runtime writes goes back as binary
//! messages. As kube-apiserver's stream tunnel does; no SPDY frame is parsed here.

use futures::{SinkExt, StreamExt};
use hyper::{Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::protocol::{frame::coding::CloseCode, CloseFrame};
use tokio_tungstenite::tungstenite::Message;

pub use rkube_core::upgrade::PORTFORWARD_TUNNEL as PROTOCOL;

/// The SPDY protocol of port-forward, as the runtime is asked for it.
const PORTFORWARD_V1: &str = "portforward.k8s.io";

/// Opens the runtime's SPDY port-forward at `url`, answers the client's WebSocket handshake with
/// the tunnel subprotocol and relays until either side ends. A runtime that refuses is the
/// client's error, not a switched protocol.
pub async fn serve(
    url: &str,
    mut req: Request<hyper::body::Incoming>,
) -> Result<Response<crate::exec_websocket::Body>, String> {
    let runtime = crate::exec_websocket::open_runtime(url, PORTFORWARD_V1).await?;
    tracing::info!(
        path = req.uri().path(),
        "a port-forward tunnelled in a WebSocket ({PROTOCOL}), unwrapped to SPDY toward the runtime"
    );
    crate::exec_websocket::accept(&mut req, PROTOCOL, move |ws| async move {
        if let Err(e) = relay(ws, hyper_util::rt::TokioIo::new(runtime)).await {
            tracing::debug!("port-forward over WebSocket ended: {e}");
        }
    })
}

/// Copies the payloads of the client's binary messages to `runtime` and what `runtime` writes
/// back as binary messages, until either side closes; then closes the other.
async fn relay<S, R>(
    mut ws: tokio_tungstenite::WebSocketStream<S>,
    runtime: R,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut read, mut write) = tokio::io::split(runtime);
    let mut buf = vec![0u8; crate::spdy::MAX_DATA + 8];
    let outcome = loop {
        tokio::select! {
            n = read.read(&mut buf) => match n {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    if let Err(e) = ws.send(Message::binary(buf[..n].to_vec())).await {
                        break Err(e.to_string());
                    }
                }
                Err(e) => break Err(e.to_string()),
            },
            message = ws.next() => match message {
                Some(Ok(Message::Binary(data))) => {
                    if let Err(e) = write.write_all(&data).await {
                        break Err(e.to_string());
                    }
                    if let Err(e) = write.flush().await {
                        break Err(e.to_string());
                    }
                }
                Some(Ok(Message::Text(_))) => {
                    break Err("a text message in a SPDY tunnel, which carries binary ones only".into())
                }
                Some(Ok(Message::Close(_))) | None => break Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(e.to_string()),
            },
        }
    };
    let _ = write.shutdown().await;
    let _ = ws
        .close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        }))
        .await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// Bytes go through unchanged both ways, message boundaries aside, and the client's close
    /// ends the runtime's side.
    #[tokio::test]
    async fn the_tunnel_carries_bytes_both_ways_and_closes() {
        let (client_io, server_io) = tokio::io::duplex(1 << 16);
        let (runtime_io, mut runtime) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move {
            let ws =
                tokio_tungstenite::WebSocketStream::from_raw_socket(server_io, Role::Server, None)
                    .await;
            relay(ws, runtime_io).await
        });
        let mut client =
            tokio_tungstenite::WebSocketStream::from_raw_socket(client_io, Role::Client, None)
                .await;
        client
            .send(Message::binary(b"\x80\x03\x00\x01".to_vec()))
            .await
            .unwrap();
        client
            .send(Message::binary(b"more".to_vec()))
            .await
            .unwrap();
        let mut got = [0u8; 8];
        runtime.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"\x80\x03\x00\x01more");
        runtime.write_all(b"reply").await.unwrap();
        let Some(Ok(Message::Binary(back))) = client.next().await else {
            panic!("no binary message back");
        };
        assert_eq!(&back[..], b"reply");
        client.close(None).await.unwrap();
        let mut rest = Vec::new();
        runtime.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        server.await.unwrap().unwrap();
    }
}
