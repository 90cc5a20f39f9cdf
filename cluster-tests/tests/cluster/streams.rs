//! Streams into real containers (`rkube up --runtime cri`, busybox built here), as users and
//! clients open them: `kubectl port-forward` over its WebSocket tunnel (kubectl 1.32's default)
//! and over SPDY, the older WebSocket port-forward protocol frame by frame (the official Python
//! client's), `kubectl attach -it` to a shell on a terminal with the window resized, over a
//! WebSocket and over SPDY, and `kubectl run -it --rm` with a command's input and output.

use std::time::Duration;

use cluster_tests::{wait_for, Cluster};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;

use super::common::{cri_cluster, port_forward_get};

const BOUND: Duration = Duration::from_secs(90);

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: rkube.local/busybox:1
    command: ["sh", "-c", "echo hello from web > /www/index.html; yes 0123456789abcdef | head -c 2000000 >> /www/index.html; exec httpd -f -p 8080 -h /www"]
---
apiVersion: v1
kind: Pod
metadata:
  name: shell
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: sh
    image: rkube.local/busybox:1
    command: ["sh"]
    stdin: true
    tty: true
"#;

/// How many times the agent logged `line`.
fn agent_logged(c: &Cluster, line: &str) -> usize {
    std::fs::read_to_string(c.path().join("agent1.log"))
        .unwrap_or_default()
        .matches(line)
        .count()
}

const TUNNELLED: &str = "unwrapped to SPDY toward the runtime";
const TRANSLATED: &str = "translated to SPDY toward the runtime";

type Ws = tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// A WebSocket to `path` through the API, offering `protocol` (or none), as a client that
/// speaks the channel protocols itself opens it; the subprotocol agreed is checked.
async fn open_ws(client: &kube::Client, path: &str, protocol: Option<&str>) -> Ws {
    let mut request = http::Request::get(path)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==");
    if let Some(p) = protocol {
        request = request.header("sec-websocket-protocol", p);
    }
    let request = request
        .body(kube::client::Body::from(Vec::new()))
        .expect("a request");
    let mut answer = client.send(request).await.expect("an answer");
    assert_eq!(answer.status().as_u16(), 101, "{protocol:?}: {answer:?}");
    assert_eq!(
        answer
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
        protocol.unwrap_or(""),
        "the subprotocol agreed (none is an empty one, as the kubelet answers it)"
    );
    let upgraded = hyper::upgrade::on(&mut answer).await.expect("upgraded");
    tokio_tungstenite::WebSocketStream::from_raw_socket(
        hyper_util::rt::TokioIo::new(upgraded),
        Role::Client,
        None,
    )
    .await
}

/// Port-forward to the pod's 8080 over a WebSocket as the older protocol has it (`protocol`
/// offered, or none): per port a data channel (0) and an error channel (1), each message's
/// first byte its channel, each channel's first message the port in little endian. Returns
/// what came back on the data channel for an HTTP request.
async fn raw_port_forward(client: &kube::Client, protocol: Option<&str>) -> String {
    let path = "/api/v1/namespaces/default/pods/web/portforward?ports=8080";
    let mut ws = open_ws(client, path, protocol).await;
    let port = 8080u16.to_le_bytes();
    let mut firsts = Vec::new();
    while firsts.len() < 2 {
        let message = tokio::time::timeout(BOUND, ws.next())
            .await
            .expect("the channels' first messages in time");
        let Some(Ok(Message::Binary(data))) = message else {
            panic!("{protocol:?}: not a binary message: {message:?}");
        };
        firsts.push(data.to_vec());
    }
    firsts.sort();
    assert_eq!(
        firsts,
        vec![vec![0, port[0], port[1]], vec![1, port[0], port[1]]],
        "{protocol:?}: each channel opens with its port"
    );
    let mut get = vec![0u8];
    get.extend_from_slice(b"GET / HTTP/1.0\r\n\r\n");
    ws.send(Message::binary(get)).await.expect("request sent");
    let mut data = Vec::new();
    let ended = tokio::time::timeout(BOUND, async {
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Binary(m) if m.first() == Some(&0) => data.extend_from_slice(&m[1..]),
                Message::Binary(m) if m.len() > 1 => {
                    panic!("error channel: {}", String::from_utf8_lossy(&m[1..]))
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "{protocol:?}: the connection did not end");
    String::from_utf8_lossy(&data).to_string()
}

/// exec over a WebSocket with v4.channel.k8s.io as the Python client asks for it (its flags
/// spelled `True`): stdout on channel 1, the command's status on channel 3.
async fn raw_exec(client: &kube::Client) -> (String, String) {
    let path = "/api/v1/namespaces/default/pods/web/exec?command=head&command=-n1&command=/www/index.html&stdin=False&stdout=True&stderr=True&tty=False";
    let mut ws = open_ws(client, path, Some("v4.channel.k8s.io")).await;
    let (mut stdout, mut status) = (Vec::new(), Vec::new());
    let ended = tokio::time::timeout(BOUND, async {
        while let Some(Ok(message)) = ws.next().await {
            match message {
                Message::Binary(m) if m.first() == Some(&1) => stdout.extend_from_slice(&m[1..]),
                Message::Binary(m) if m.first() == Some(&3) => status.extend_from_slice(&m[1..]),
                Message::Close(_) => break,
                _ => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the exec did not end");
    (
        String::from_utf8_lossy(&stdout).to_string(),
        String::from_utf8_lossy(&status).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_attach_and_run_on_a_terminal_into_real_containers() {
    let (c, k) = cri_cluster(1).await;
    k.run_with_input(&["apply", "-f", "-"], PODS).await.ok();
    let ready = k
        .run(&[
            "wait",
            "--for=condition=Ready",
            "pod/web",
            "pod/shell",
            "--timeout=90s",
        ])
        .await;
    assert!(ready.success, "{}{}", ready.stdout, ready.stderr);

    // kubectl port-forward: by default a SPDY session tunnelled in a WebSocket, which the
    // agent unwraps; with KUBECTL_PORT_FORWARD_WEBSOCKETS=false plain SPDY, passed through.
    // The page is 2 MB: more than any one message or SPDY window carries.
    let page = |body: &str| {
        body.contains("Content-Length: 2000015\r\n")
            && body.split_once("\r\n\r\n").is_some_and(|(_, page)| {
                page.len() == 2_000_015
                    && page.starts_with("hello from web\n0123456789abcdef\n")
                    && page.ends_with("0123456789abcdef\n0")
            })
    };
    let body = port_forward_get(&k, "pod/web", 8080).await;
    assert!(
        page(&body),
        "{} bytes: {}",
        body.len(),
        &body[..body.len().min(300)]
    );
    assert_eq!(
        agent_logged(&c, TUNNELLED),
        1,
        "kubectl port-forward did not arrive as a WebSocket tunnel"
    );
    let body = port_forward_get(
        &k.with_env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"),
        "pod/web",
        8080,
    )
    .await;
    assert!(
        page(&body),
        "{} bytes: {}",
        body.len(),
        &body[..body.len().min(300)]
    );
    assert_eq!(
        agent_logged(&c, TUNNELLED),
        1,
        "SPDY went through the tunnel"
    );

    // The older WebSocket protocol, with its subprotocol and with none.
    let client = super::kube_client::client_of(&c, 0).await;
    for protocol in [Some("v4.channel.k8s.io"), None] {
        let answer = raw_port_forward(&client, protocol).await;
        assert!(
            answer.starts_with("HTTP/1.") && page(&answer),
            "{protocol:?}: {} bytes: {}",
            answer.len(),
            &answer[..answer.len().min(300)]
        );
    }

    let (stdout, status) = raw_exec(&client).await;
    assert_eq!(stdout, "hello from web\n");
    assert!(status.contains("\"status\":\"Success\""), "{status}");

    // kubectl attach -it to a shell on a terminal, over a WebSocket (v5): what is typed runs,
    // the terminal's size reaches the container, and so does a resize.
    let translated = agent_logged(&c, TRANSLATED);
    let mut t = k.in_terminal(&["attach", "-it", "shell"], 30, 100);
    t.wait_for(
        "If you don't see a command prompt, try pressing enter.",
        BOUND,
    )
    .await;
    t.type_text("X=kept; echo marker-$((6*7))\r");
    t.wait_for("marker-42", BOUND).await;
    t.type_text("stty size\r");
    t.wait_for("30 100", BOUND).await;
    resize_and_see(&mut t, 40, 120).await;
    assert_eq!(
        agent_logged(&c, TRANSLATED),
        translated + 1,
        "kubectl attach did not arrive as a v5 WebSocket"
    );
    // Closing kubectl leaves the shell running; a second attach over SPDY finds it as it was.
    t.kill().await;
    let spdy = k.with_env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
    let mut t = spdy.in_terminal(&["attach", "-it", "shell"], 24, 80);
    t.wait_for(
        "If you don't see a command prompt, try pressing enter.",
        BOUND,
    )
    .await;
    t.type_text("echo $X-again\r");
    t.wait_for("kept-again", BOUND).await;
    resize_and_see(&mut t, 50, 132).await;
    t.type_text("exit 0\r");
    let (status, _) = t.wait_exit(BOUND).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(agent_logged(&c, TRANSLATED), translated + 1);
    wait_for("the shell's pod Succeeded", BOUND, || async {
        let phase = k
            .run(&["get", "pod", "shell", "-o", "jsonpath={.status.phase}"])
            .await
            .ok();
        (phase == "Succeeded").then_some(())
    })
    .await;

    // kubectl run -it --rm: the pod is made with a terminal, attached to, and deleted after.
    let mut t = k.in_terminal(
        &[
            "run",
            "say",
            "--image=rkube.local/busybox:1",
            "--restart=Never",
            "-it",
            "--rm",
            "--",
            "sh",
            "-c",
            "read x; echo got-$x; exit 3",
        ],
        24,
        80,
    );
    t.wait_for(
        "If you don't see a command prompt, try pressing enter.",
        BOUND,
    )
    .await;
    t.type_text("abc\r");
    t.wait_for("got-abc", BOUND).await;
    let (status, rest) = t.wait_exit(BOUND).await;
    assert_eq!(status.code(), Some(3), "{rest}");
    assert!(rest.contains("pod \"say\" deleted"), "{rest}");
    wait_for("the pod of kubectl run gone", BOUND, || async {
        let out = k.run(&["get", "pod", "say"]).await;
        (!out.success && out.stderr.contains("NotFound")).then_some(())
    })
    .await;
}

/// Resizes the terminal until `stty size` in the container shows the new size (kubectl sends
/// it when its SIGWINCH arrives, which a command typed just after may outrun).
async fn resize_and_see(t: &mut cluster_tests::pty::Terminal, rows: u16, cols: u16) {
    t.resize(rows, cols);
    let size = format!("{rows} {cols}");
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        t.type_text("stty size\r");
        if t.try_wait_for(&size, Duration::from_secs(2))
            .await
            .is_some()
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the container's terminal never became {size}"
        );
    }
}
