//! Passing a streaming upgrade on (`kubectl exec`, `attach`, `port-forward`): the API server
//! toward an agent, an agent toward its runtime's streaming server.

/// The headers that carry a streaming upgrade and its protocol negotiation: SPDY's, and a
/// WebSocket's handshake (its key, version and subprotocols), which the far side answers and
/// the client checks end to end.
const UPGRADE_HEADERS: [&str; 6] = [
    "connection",
    "upgrade",
    "x-stream-protocol-version",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
];

/// The WebSocket subprotocols of Kubernetes' streams that the container runtime's streaming
/// server (containerd's) speaks, for exec and attach and for port-forward alike.
/// `v5.channel.k8s.io`, which adds closing one stream (stdin) to v4, is not among them.
pub const WEBSOCKET_PROTOCOLS: [&str; 4] = [
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// The WebSocket subprotocol of exec and attach that the agent translates to SPDY toward the
/// runtime (the runtime does not speak it).
pub const EXEC_V5: &str = "v5.channel.k8s.io";

/// The WebSocket subprotocol of kubectl's port-forward (client-go's tunneling dialer, the
/// PortForwardWebsockets feature): a SPDY/3.1 session of `portforward.k8s.io`, its bytes carried
/// as they are in binary WebSocket messages. The agent unwraps it toward the runtime, which
/// speaks the SPDY session but not the tunnel.
pub const PORTFORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

/// Whether a request's `Sec-WebSocket-Protocol` (comma-separated, possibly in several headers)
/// offers one of [`WEBSOCKET_PROTOCOLS`], or names no subprotocol at all (which the runtime's
/// streaming server takes as the binary channel protocol, as the kubelet does).
pub fn offers_served_websocket_protocol(headers: &hyper::HeaderMap) -> bool {
    !headers.contains_key("sec-websocket-protocol") || offers(headers, &WEBSOCKET_PROTOCOLS)
}

/// Whether a request's `Sec-WebSocket-Protocol` offers one of `protocols`.
pub fn offers(headers: &hyper::HeaderMap, protocols: &[&str]) -> bool {
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| protocols.contains(&p.trim()))
}

/// A boolean query parameter of exec, attach and logs (`stdin=`, `tty=`, `follow=`) as
/// Kubernetes parses it (Go's `strconv.ParseBool`): `1`, `t`, `T`, `true`, `TRUE` and `True`
/// are true (the Python client sends `True`), anything else false.
pub fn query_flag(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// An upgrade request to pass on: the client's method, headers and (once answered) connection.
pub struct UpgradeRequest<'a> {
    pub method: &'a hyper::Method,
    pub path_and_query: &'a str,
    pub headers: &'a hyper::HeaderMap,
    pub client: hyper::upgrade::OnUpgrade,
}

/// Sends an upgrade request over `io` (the API server toward an agent, an agent toward its
/// runtime's streaming server) and, when the far side switches protocols, joins its upgraded
/// connection with the client's. The far side's answer is returned either way: a 101 to pass
/// on, or its refusal.
pub async fn upgrade_through<IO>(
    io: IO,
    host: &str,
    request: UpgradeRequest<'_>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut req = hyper::Request::builder()
        .method(request.method)
        .uri(request.path_and_query)
        .header("host", host);
    for (k, v) in request.headers {
        if UPGRADE_HEADERS.contains(&k.as_str()) {
            req = req.header(k, v);
        }
    }
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("a request of parts already parsed");
    let mut resp = sender.send_request(req).await?;
    if resp.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        let far = hyper::upgrade::on(&mut resp);
        let client = request.client;
        tokio::spawn(async move {
            let (Ok(far), Ok(client)) = tokio::join!(far, client) else {
                return;
            };
            let mut far = hyper_util::rt::TokioIo::new(far);
            let mut client = hyper_util::rt::TokioIo::new(client);
            let _ = tokio::io::copy_bidirectional(&mut far, &mut client).await;
        });
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_as_go_does() {
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(query_flag(v), "{v}");
        }
        for v in ["0", "false", "False", "", "yes", "tRuE"] {
            assert!(!query_flag(v), "{v}");
        }
    }

    #[test]
    fn subprotocols_offered() {
        let mut h = hyper::HeaderMap::new();
        assert!(
            offers_served_websocket_protocol(&h),
            "none offered is the binary protocol"
        );
        h.insert(
            "sec-websocket-protocol",
            "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
        );
        assert!(offers(&h, &[EXEC_V5]));
        assert!(offers_served_websocket_protocol(&h));
        h.insert(
            "sec-websocket-protocol",
            PORTFORWARD_TUNNEL.parse().unwrap(),
        );
        assert!(offers(&h, &[PORTFORWARD_TUNNEL]));
        assert!(!offers_served_websocket_protocol(&h));
    }
}
