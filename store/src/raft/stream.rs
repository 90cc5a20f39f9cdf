//! The Raft stream: AppendEntries and Vote between members as length-prefixed bincode frames on
//! one long-lived mutual-TLS connection per peer. The peer port offers it under the ALPN
//! protocol [`ALPN`] beside snapshot streams (`snapshot_stream`) and gRPC's `h2` (which keeps
//! the elections' forwarded requests).
//!
//! Why not gRPC for these two: with one client, a put's AppendEntries crossed tonic's buffer
//! task and h2's connection task on the leader, and h2's connection task and a spawned stream
//! task on the follower, each a thread wake-up; the request took 165 µs to reach the follower's
//! handler. Here the caller writes the frame to the socket itself, and the follower's reader
//! hands it to openraft at once. etcd's rafthttp keeps a long-lived stream per peer for the
//! same reason.
//!
//! A request frame is `len: u32 | id: u64 | kind: u8 | payload`, an answer frame
//! `len: u32 | id: u64 | outcome: u8 | payload`, big-endian, `len` counting what follows it.
//! Answers carry the request's id, so calls on one connection (a heartbeat beside an append)
//! may be answered out of order.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The ALPN protocol name of the Raft stream.
pub const ALPN: &[u8] = b"rkube-raft/1";

/// A frame larger than this is a broken stream, not a message (an AppendEntries carries at
/// most `max_payload_entries` entries of at most a request's size each).
const MAX_FRAME: usize = 1 << 30;

/// What a request frame asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Append = 1,
    Vote = 2,
    /// A request a member hands to the leader (`server::node::Forward`).
    Forward = 3,
}

impl Kind {
    pub fn from_tag(tag: u8) -> Option<Kind> {
        match tag {
            1 => Some(Kind::Append),
            2 => Some(Kind::Vote),
            3 => Some(Kind::Forward),
            _ => None,
        }
    }
}

/// An answer frame's outcome: the payload is openraft's bincode-encoded result.
pub const ANSWERED: u8 = 0;
/// An answer frame's outcome: the peer could not take the request; the payload is its reason.
pub const REFUSED: u8 = 1;

/// One frame, ready to write.
pub fn frame(id: u64, tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(13 + payload.len());
    out.extend_from_slice(&((9 + payload.len()) as u32).to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.push(tag);
    out.extend_from_slice(payload);
    out
}

/// Reads one frame: `(id, tag, payload)`, or None when the peer closed the connection between
/// frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<(u64, u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if !(9..=MAX_FRAME).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("Raft stream frame of {len} bytes: the peer is not speaking this protocol"),
        ));
    }
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await?;
    let mut payload = vec![0u8; len - 9];
    r.read_exact(&mut payload).await?;
    let id = u64::from_be_bytes(head[..8].try_into().unwrap_or_default());
    Ok(Some((id, head[8], payload)))
}

/// Why a call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection could be made: the request never left.
    #[error("peer {addr} unreachable: {source}")]
    Unreachable {
        addr: String,
        #[source]
        source: io::Error,
    },
    /// The connection broke once the request was (perhaps partly) written, before its
    /// answer came: the peer may or may not have served it.
    #[error("connection to peer {addr} lost: {source}")]
    Lost {
        addr: String,
        #[source]
        source: io::Error,
    },
    /// The answer did not come within the call's time.
    #[error("peer {addr} did not answer within {ttl:?}")]
    TimedOut { addr: String, ttl: Duration },
}

type Answer = Result<(u8, Vec<u8>), io::Error>;

/// A connection on which calls time out and no answer has come for this long is given up and
/// made anew by the next call: a peer whose host vanished (no reset ever comes) would
/// otherwise keep it half open, and every call would wait out its deadline on it.
const SILENCE: Duration = Duration::from_secs(5);

/// Calls waiting for their answers on one connection.
struct Waiting {
    calls: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    closed: AtomicBool,
    /// When the last answer (or the connection) came.
    heard: Mutex<Instant>,
}

impl Default for Waiting {
    fn default() -> Self {
        Waiting {
            calls: Mutex::default(),
            closed: AtomicBool::new(false),
            heard: Mutex::new(Instant::now()),
        }
    }
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Answer>>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection is gone: every waiting call fails now rather than at its deadline.
    fn close(&self, why: &str) {
        self.closed.store(true, Ordering::Release);
        for (_, call) in self.lock().drain() {
            let _ = call.send(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                why.to_string(),
            )));
        }
    }
}

struct Conn {
    writer: WriteHalf<TlsStream<TcpStream>>,
    waiting: Arc<Waiting>,
    reader: AbortHandle,
    next: u64,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
        self.waiting.close("the connection was dropped");
    }
}

/// The Raft stream to one peer address, connected on first use and again after it breaks.
pub struct Link {
    addr: String,
    connector: TlsConnector,
    conn: tokio::sync::Mutex<Option<Conn>>,
}

impl Link {
    pub fn new(addr: String, connector: TlsConnector) -> Link {
        Link {
            addr,
            connector,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    /// Sends one request and waits for its answer, all within `ttl`: `(outcome, payload)`.
    pub async fn call(
        &self,
        kind: Kind,
        payload: &[u8],
        ttl: Duration,
    ) -> Result<(u8, Vec<u8>), CallError> {
        let deadline = Instant::now() + ttl;
        let timed_out = || CallError::TimedOut {
            addr: self.addr.clone(),
            ttl,
        };
        let lost = |source| CallError::Lost {
            addr: self.addr.clone(),
            source,
        };
        let (id, waiting, answer) = tokio::time::timeout_at(deadline, self.send(kind, payload))
            .await
            .map_err(|_| timed_out())?
            .map_err(|(written, source)| match written {
                false => CallError::Unreachable {
                    addr: self.addr.clone(),
                    source,
                },
                true => lost(source),
            })?;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(answer)) => answer.map_err(lost),
            Ok(Err(_)) => Err(lost(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the connection closed before the answer came",
            ))),
            Err(_) => {
                waiting.lock().remove(&id);
                let silent = waiting
                    .heard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .elapsed();
                if silent > SILENCE {
                    let mut slot = self.conn.lock().await;
                    if slot
                        .as_ref()
                        .is_some_and(|c| Arc::ptr_eq(&c.waiting, &waiting))
                    {
                        tracing::debug!(peer = %self.addr, ?silent, "Raft stream silent; reconnecting");
                        *slot = None;
                    }
                }
                Err(timed_out())
            }
        }
    }

    /// Writes one request; an error says whether any of it may have been written.
    async fn send(
        &self,
        kind: Kind,
        payload: &[u8],
    ) -> Result<(u64, Arc<Waiting>, oneshot::Receiver<Answer>), (bool, io::Error)> {
        let mut slot = self.conn.lock().await;
        // Taken out while writing: a call cancelled in the middle of a frame (its deadline)
        // drops the connection with it instead of leaving half a frame for the next call.
        let mut conn = match slot.take() {
            Some(c) if !c.waiting.closed.load(Ordering::Acquire) => c,
            _ => self.connect().await.map_err(|e| (false, e))?,
        };
        let id = conn.next;
        conn.next += 1;
        let (tx, rx) = oneshot::channel();
        conn.waiting.lock().insert(id, tx);
        let bytes = frame(id, kind as u8, payload);
        conn.writer.write_all(&bytes).await.map_err(|e| (true, e))?;
        conn.writer.flush().await.map_err(|e| (true, e))?;
        let waiting = conn.waiting.clone();
        *slot = Some(conn);
        Ok((id, waiting, rx))
    }

    async fn connect(&self) -> io::Result<Conn> {
        let tls = connect(&self.addr, &self.connector, ALPN).await?;
        let (reader, writer) = tokio::io::split(tls);
        let waiting = Arc::new(Waiting::default());
        let reader = tokio::spawn(read_answers(reader, waiting.clone())).abort_handle();
        Ok(Conn {
            writer,
            waiting,
            reader,
            next: 0,
        })
    }
}

/// A mutual-TLS connection to the peer at `addr` (`host:port`) that agreed to the ALPN protocol
/// `alpn`: the Raft stream's, or a snapshot stream's (`snapshot_stream`).
pub(crate) async fn connect(
    addr: &str,
    connector: &TlsConnector,
    alpn: &[u8],
) -> io::Result<TlsStream<TcpStream>> {
    let (host, _) = addr.rsplit_once(':').ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("peer address {addr} has no port"),
        )
    })?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let name = rustls::pki_types::ServerName::try_from(host)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let tcp = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    tcp.set_nodelay(true)?;
    let tls = connector.connect(name, tcp).await?;
    if tls.get_ref().1.alpn_protocol() != Some(alpn) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the peer does not offer {} (is it running the same rkube version?)",
                String::from_utf8_lossy(alpn)
            ),
        ));
    }
    Ok(tls)
}

/// Hands each answer to the call waiting for it, until the connection ends.
async fn read_answers(mut reader: ReadHalf<TlsStream<TcpStream>>, waiting: Arc<Waiting>) {
    let why = loop {
        match read_frame(&mut reader).await {
            Ok(Some((id, outcome, payload))) => {
                *waiting.heard.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
                if let Some(call) = waiting.lock().remove(&id) {
                    let _ = call.send(Ok((outcome, payload)));
                }
            }
            Ok(None) => break "the peer closed the connection".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    waiting.close(&why);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    /// A member's TLS material, made in `dir`.
    pub(crate) fn material(dir: &std::path::Path) -> rkube_pki::TlsMaterial {
        rkube_pki::init_ca(dir).expect("ca");
        rkube_pki::issue(dir, "m", "m", None, &["127.0.0.1".into()], true, true).expect("cert");
        rkube_pki::TlsFiles::for_member(dir, "m")
            .load()
            .expect("material")
    }

    /// A peer on loopback that takes Raft stream connections and serves each with `serve`.
    async fn peer<F, Fut>(m: &rkube_pki::TlsMaterial, serve: F) -> Link
    where
        F: Fn(tokio_rustls::server::TlsStream<TcpStream>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let acceptor = TlsAcceptor::from(Arc::new(m.rustls_server(&[ALPN]).expect("server")));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let serve = Arc::new(serve);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, serve) = (acceptor.clone(), serve.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(tls).await;
                    }
                });
            }
        });
        let client = m.rustls_client(&[ALPN]).expect("client");
        Link::new(addr, TlsConnector::from(Arc::new(client)))
    }

    #[tokio::test]
    async fn answers_reach_their_callers_whatever_their_order() {
        let dir = tempfile::tempdir().expect("dir");
        let m = material(dir.path());
        // Reads two requests, answers the second first.
        let link = Arc::new(
            peer(&m, |mut tls| async move {
                let a = read_frame(&mut tls).await.expect("read").expect("first");
                let b = read_frame(&mut tls).await.expect("read").expect("second");
                for (id, _, payload) in [b, a] {
                    tls.write_all(&frame(id, ANSWERED, &payload))
                        .await
                        .expect("write");
                }
                tls.flush().await.expect("flush");
                let _ = read_frame(&mut tls).await;
            })
            .await,
        );
        let ttl = Duration::from_secs(10);
        let first = link.call(Kind::Append, b"one", ttl);
        let second = async {
            tokio::task::yield_now().await;
            link.call(Kind::Vote, b"two", ttl).await
        };
        let (first, second) = tokio::join!(first, second);
        assert_eq!(first.expect("first answered"), (ANSWERED, b"one".to_vec()));
        assert_eq!(
            second.expect("second answered"),
            (ANSWERED, b"two".to_vec())
        );
    }

    #[tokio::test]
    async fn a_silent_peer_times_out_and_a_closed_connection_is_made_anew() {
        let dir = tempfile::tempdir().expect("dir");
        let m = material(dir.path());
        let ttl = Duration::from_millis(300);
        let silent = peer(&m, |mut tls| async move {
            while let Ok(Some(_)) = read_frame(&mut tls).await {}
        })
        .await;
        assert!(matches!(
            silent.call(Kind::Vote, b"x", ttl).await,
            Err(CallError::TimedOut { .. })
        ));
        // Answers one request per connection, then closes it.
        let once = peer(&m, |mut tls| async move {
            if let Ok(Some((id, _, payload))) = read_frame(&mut tls).await {
                let _ = tls.write_all(&frame(id, ANSWERED, &payload)).await;
                let _ = tls.flush().await;
            }
            let _ = tls.shutdown().await;
        })
        .await;
        let ttl = Duration::from_secs(10);
        let mut failures = 0;
        for i in 0..5u8 {
            // A call racing the close may be lost (the caller retries, as openraft does); the
            // one after it finds the link connected again.
            let answer = match once.call(Kind::Vote, &[i], ttl).await {
                Ok(a) => a,
                Err(CallError::Unreachable { .. }) => {
                    failures += 1;
                    once.call(Kind::Vote, &[i], ttl).await.expect("reconnected")
                }
                Err(e) => panic!("{e}"),
            };
            assert_eq!(answer, (ANSWERED, vec![i]));
        }
        assert!(failures <= 5);
    }

    #[tokio::test]
    async fn frames_read_back_as_written() {
        let mut bytes = frame(7, Kind::Vote as u8, b"hello");
        bytes.extend(frame(u64::MAX, REFUSED, b""));
        let mut r = &bytes[..];
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some((7, Kind::Vote as u8, b"hello".to_vec()))
        );
        assert_eq!(
            read_frame(&mut r).await.unwrap(),
            Some((u64::MAX, REFUSED, vec![]))
        );
        assert_eq!(read_frame(&mut r).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_length_that_is_not_a_frame_is_an_error() {
        for len in [0u32, 8, u32::MAX] {
            let mut r = &len.to_be_bytes()[..];
            let e = read_frame(&mut r).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{len}");
        }
        // Cut in the middle of a frame: not a clean end.
        let bytes = frame(1, 1, b"abc");
        let mut r = &bytes[..bytes.len() - 1];
        assert!(read_frame(&mut r).await.is_err());
    }
}
