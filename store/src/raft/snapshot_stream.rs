//! A snapshot sent to a follower whole, on a mutual-TLS connection of its own (ALPN protocol
//! [`ALPN`] on the peer port), instead of openraft 0.9's chunks of a few MiB, each an RPC of its
//! own that waits for the follower to write it before the next leaves.
//!
//! Why: with one chunk in flight, the leader's reading and encrypting and the follower's
//! decrypting and writing never overlapped, and every chunk was a fresh multi-MiB buffer on both
//! sides (page faults and `malloc` were most of a 200 MB transfer's samples, 2026-12-07). Here
//! the data goes through one reused buffer per side and TCP keeps it moving while either side
//! works. etcd sends its snapshots the same way: one stream per snapshot, beside the messages.
//!
//! The exchange, with frames as on the Raft stream (`stream::frame`, id 0):
//! 1. the leader sends [`Head`]: its vote, the snapshot's metadata and the data's length;
//! 2. the follower answers [`SEND`] to ask for the data, or, when it has already seen a higher
//!    vote, its final answer at once (nothing is sent for nothing);
//! 3. the leader sends the data, `len` bytes, as they are;
//! 4. the follower installs it through openraft (`Raft::install_full_snapshot`), sending
//!    [`INSTALLING`] every third of the call's time while it does, and answers with openraft's
//!    bincode-encoded result ([`stream::ANSWERED`]), or why it could not ([`stream::REFUSED`]).
//!
//! A stream the leader gives up (openraft cancels it, or a timeout) is dropped with its
//! connection: the follower reads a short stream, installs nothing and removes what it received.
//! Each stream receives into a file of its own, so a stream that outlives its leader's interest
//! never mixes with the next one. Every read and write, and every wait for the follower's next
//! frame, must make progress within the call's time (openraft's `install_snapshot_timeout`); the
//! transfer and the install as a whole may take longer.

use std::future::Future;
use std::io::{self, SeekFrom};
use std::time::Duration;

use openraft::error::{Fatal, NetworkError, RemoteError, StreamingError, Unreachable};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse};
use openraft::storage::Snapshot;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::snapshot_data::{self, SnapshotData};
use super::state_machine::snapshot_file_head;
use super::stream::{self, ANSWERED, REFUSED};
use super::{snapshot_read, NodeId, Raft, SnapshotMetadata, TypeConfig, Vote};

/// The ALPN protocol name of a snapshot stream.
pub const ALPN: &[u8] = b"rkube-snapshot/1";

/// The kind of the leader's first frame, the head.
const HEAD: u8 = 0;
/// The follower's answer to the head: send the data.
pub const SEND: u8 = 2;
/// A frame the follower sends while it installs, so that the leader's wait for the answer
/// makes progress however long the install takes (a large store's restore may outlast the
/// call's time).
pub const INSTALLING: u8 = 3;

/// How much of the data each side moves at a time, through one buffer reused for the whole
/// stream.
const PIECE: usize = 1 << 20;

/// What the leader sends before the data.
#[derive(Serialize, Deserialize)]
struct Head {
    vote: Vote,
    meta: SnapshotMetadata,
    /// The data's length in bytes.
    len: u64,
}

/// openraft's answer to a snapshot, as the follower sends it back.
type Installed = Result<SnapshotResponse<NodeId>, Fatal<NodeId>>;
/// What sending a snapshot returns to openraft.
pub type Sent = Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>>;

fn network(e: impl std::error::Error + 'static) -> StreamingError<TypeConfig, Fatal<NodeId>> {
    StreamingError::Network(NetworkError::new(&e))
}

/// `f`, failing as timed out unless it finishes within `ttl`.
async fn within<T>(
    ttl: Duration,
    what: &str,
    f: impl Future<Output = io::Result<T>>,
) -> io::Result<T> {
    tokio::time::timeout(ttl, f).await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{what}: no progress within {ttl:?}"),
        ))
    })
}

/// Reads one frame, failing if the peer closed the connection instead.
async fn answer_frame<R: AsyncRead + Unpin>(r: &mut R, ttl: Duration) -> io::Result<(u8, Vec<u8>)> {
    match within(ttl, "waiting for the peer's answer", stream::read_frame(r)).await? {
        Some((_, outcome, payload)) => Ok((outcome, payload)),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the snapshot stream without an answer",
        )),
    }
}

/// Sends `snapshot` to the member at `addr` and returns its answer: the leader's side of the
/// exchange, for `RaftNetwork::full_snapshot`.
pub async fn send(
    addr: &str,
    target: NodeId,
    connector: &TlsConnector,
    vote: Vote,
    snapshot: Snapshot<TypeConfig>,
    ttl: Duration,
) -> Sent {
    let Snapshot { meta, snapshot } = snapshot;
    let mut data = *snapshot;
    let len = data.seek(SeekFrom::End(0)).await.map_err(snapshot_read)?;
    data.seek(SeekFrom::Start(0)).await.map_err(snapshot_read)?;
    let mut conn = within(ttl, "connecting", stream::connect(addr, connector, ALPN))
        .await
        .map_err(|e| StreamingError::Unreachable(Unreachable::new(&e)))?;
    let head = bincode::serialize(&Head { vote, meta, len }).map_err(network)?;
    within(ttl, "sending the snapshot's head", async {
        conn.write_all(&stream::frame(0, HEAD, &head)).await?;
        conn.flush().await
    })
    .await
    .map_err(network)?;
    match answer_frame(&mut conn, ttl).await.map_err(network)? {
        (SEND, _) => {}
        (outcome, payload) => return decode_answer(target, outcome, &payload),
    }
    let mut buf = vec![0u8; PIECE.min(len as usize)];
    let mut sent = 0u64;
    while sent < len {
        let n = buf.len().min((len - sent) as usize);
        data.read_exact(&mut buf[..n])
            .await
            .map_err(snapshot_read)?;
        within(
            ttl,
            "sending the snapshot's data",
            conn.write_all(&buf[..n]),
        )
        .await
        .map_err(network)?;
        sent += n as u64;
    }
    within(ttl, "sending the snapshot's data", conn.flush())
        .await
        .map_err(network)?;
    loop {
        match answer_frame(&mut conn, ttl).await.map_err(network)? {
            (INSTALLING, _) => continue,
            (outcome, payload) => return decode_answer(target, outcome, &payload),
        }
    }
}

// openraft's error type is what it is.
#[allow(clippy::result_large_err)]
fn decode_answer(target: NodeId, outcome: u8, payload: &[u8]) -> Sent {
    if outcome != ANSWERED {
        let why = String::from_utf8_lossy(payload).into_owned();
        return Err(network(io::Error::other(why)));
    }
    let installed: Installed = bincode::deserialize(payload).map_err(network)?;
    installed.map_err(|e| StreamingError::RemoteError(RemoteError::new(target, e)))
}

/// What a follower needs to take a snapshot: openraft, or a stand-in in tests.
pub trait Receiver {
    /// Takes `vote` as its leader's, as a heartbeat from that leader would make it, so that
    /// the member knows its leader while the data comes; returns the member's own vote
    /// instead when that is higher.
    fn accept(&self, vote: Vote) -> impl Future<Output = Result<Option<Vote>, String>> + Send;
    /// A fresh place to receive a snapshot's data into.
    fn begin(&self) -> impl Future<Output = Result<Box<SnapshotData>, String>> + Send;
    /// Installs a received snapshot, if `vote` still allows it.
    fn install(
        &self,
        vote: Vote,
        snapshot: Snapshot<TypeConfig>,
    ) -> impl Future<Output = Installed> + Send;
}

impl Receiver for Raft {
    /// An AppendEntries with no entries and no previous log id: openraft checks and saves the
    /// vote, and nothing else changes (no log id to match, no commit index).
    async fn accept(&self, vote: Vote) -> Result<Option<Vote>, String> {
        let heartbeat = AppendEntriesRequest {
            vote,
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        match self.append_entries(heartbeat).await {
            Ok(AppendEntriesResponse::HigherVote(mine)) => Ok(Some(mine)),
            Ok(_) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn begin(&self) -> Result<Box<SnapshotData>, String> {
        self.begin_receiving_snapshot()
            .await
            .map_err(|e| e.to_string())
    }

    async fn install(&self, vote: Vote, snapshot: Snapshot<TypeConfig>) -> Installed {
        self.install_full_snapshot(vote, snapshot).await
    }
}

/// Serves one snapshot stream: the follower's side of the exchange.
pub async fn serve<S, R>(receiver: &R, mut conn: S, ttl: Duration)
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: Receiver,
{
    let (outcome, body) = match receive(receiver, &mut conn, ttl).await {
        Ok(installed) => match bincode::serialize(&installed) {
            Ok(body) => (ANSWERED, body),
            Err(e) => (REFUSED, e.to_string().into_bytes()),
        },
        Err(why) => {
            tracing::warn!(error = %why, "a snapshot from the leader was not installed");
            (REFUSED, why.into_bytes())
        }
    };
    let _ = within(ttl, "answering", async {
        conn.write_all(&stream::frame(0, outcome, &body)).await?;
        conn.flush().await?;
        conn.shutdown().await
    })
    .await;
}

/// The received file, removed when the stream is done with it: an install has moved what it
/// needs out of it by then, and a stream that broke off leaves nothing behind.
struct ReceivingFile(std::path::PathBuf);

impl Drop for ReceivingFile {
    fn drop(&mut self) {
        if let Err(e) = snapshot_data::remove_if_present(&self.0) {
            tracing::warn!(file = %self.0.display(), error = %e, "could not remove a received snapshot")
        }
    }
}

async fn receive<S, R>(receiver: &R, conn: &mut S, ttl: Duration) -> Result<Installed, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: Receiver,
{
    let head = match within(
        ttl,
        "waiting for the snapshot's head",
        stream::read_frame(conn),
    )
    .await
    {
        Ok(Some((_, HEAD, payload))) => payload,
        Ok(Some((_, kind, _))) => {
            return Err(format!(
                "a snapshot stream began with a frame of kind {kind}, not its head (is the peer \
                 running the same rkube version?)"
            ))
        }
        Ok(None) => return Err("the leader closed the snapshot stream before its head".into()),
        Err(e) => return Err(e.to_string()),
    };
    let Head { vote, meta, len } = bincode::deserialize(&head).map_err(|e| {
        format!("undecodable snapshot head (is the peer running the same rkube version?): {e}")
    })?;
    if let Some(mine) = receiver.accept(vote).await? {
        // What openraft's install would answer after the transfer.
        return Ok(Ok(SnapshotResponse::new(mine)));
    }
    within(ttl, "asking for the snapshot's data", async {
        conn.write_all(&stream::frame(0, SEND, &[])).await?;
        conn.flush().await
    })
    .await
    .map_err(|e| e.to_string())?;
    let began = std::time::Instant::now();
    let mut data = receiver.begin().await?;
    let _file = ReceivingFile(data.path().to_path_buf());
    // Received as the snapshot file it becomes, so that the install need not copy it.
    let file_head = snapshot_file_head(&meta, len).map_err(|e| e.to_string())?;
    data.write_head(&file_head)
        .await
        .map_err(|e| format!("writing a received snapshot: {e}"))?;
    let mut buf = vec![0u8; PIECE.min(len as usize)];
    let mut got = 0u64;
    while got < len {
        let n = buf.len().min((len - got) as usize);
        within(
            ttl,
            "receiving the snapshot's data",
            conn.read_exact(&mut buf[..n]),
        )
        .await
        .map_err(|e| format!("the snapshot stream broke off after {got} of {len} bytes: {e}"))?;
        data.write_all(&buf[..n])
            .await
            .map_err(|e| format!("writing a received snapshot: {e}"))?;
        got += n as u64;
    }
    data.flush()
        .await
        .map_err(|e| format!("writing a received snapshot: {e}"))?;
    tracing::info!(
        snapshot = %meta.snapshot_id,
        bytes = len,
        receive_ms = began.elapsed().as_millis() as u64,
        "received the leader's snapshot"
    );
    let snapshot = Snapshot {
        meta,
        snapshot: data,
    };
    Ok(installing(conn, receiver.install(vote, snapshot), ttl).await)
}

/// Waits for `install`, telling the leader every third of `ttl` that it is still going. If the
/// leader is gone, the install goes on all the same (openraft's cannot be called off).
async fn installing<S: AsyncWrite + Unpin>(
    conn: &mut S,
    install: impl Future<Output = Installed>,
    ttl: Duration,
) -> Installed {
    let mut install = std::pin::pin!(install);
    let mut tick = tokio::time::interval(ttl / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut leader_listens = true;
    loop {
        tokio::select! {
            installed = &mut install => return installed,
            _ = tick.tick(), if leader_listens => {
                leader_listens = within(ttl, "telling the leader the install goes on", async {
                    conn.write_all(&stream::frame(0, INSTALLING, &[])).await?;
                    conn.flush().await
                })
                .await
                .is_ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use tokio::net::TcpListener;
    use tokio_rustls::TlsAcceptor;

    use super::*;
    use crate::raft::stream::tests::material;

    const TTL: Duration = Duration::from_secs(10);

    /// A follower's stand-in: it receives into files in `dir` and keeps what it installed.
    struct Follower {
        dir: PathBuf,
        vote: Vote,
        accepted: Mutex<Vec<Vote>>,
        begun: Mutex<u64>,
        installed: Mutex<Vec<(Vote, SnapshotMetadata, Vec<u8>)>>,
        /// How long each install takes.
        install_takes: Duration,
    }

    impl Receiver for Follower {
        async fn accept(&self, vote: Vote) -> Result<Option<Vote>, String> {
            self.accepted.lock().unwrap().push(vote);
            Ok((vote < self.vote).then_some(self.vote))
        }

        async fn begin(&self) -> Result<Box<SnapshotData>, String> {
            let n = {
                let mut begun = self.begun.lock().unwrap();
                *begun += 1;
                *begun
            };
            SnapshotData::create(&self.dir.join(format!("receiving.{n}")))
                .map(Box::new)
                .map_err(|e| e.to_string())
        }

        async fn install(&self, vote: Vote, snapshot: Snapshot<TypeConfig>) -> Installed {
            let file = std::fs::read(snapshot.snapshot.path()).expect("received file");
            // The snapshot file's head comes first.
            let base = snapshot.snapshot.base() as usize;
            let head = snapshot_file_head(&snapshot.meta, (file.len() - base) as u64).unwrap();
            assert_eq!(
                file[..base],
                head[..],
                "the received file does not start with its head"
            );
            let bytes = file[base..].to_vec();
            self.installed
                .lock()
                .unwrap()
                .push((vote, snapshot.meta, bytes));
            tokio::time::sleep(self.install_takes).await;
            Ok(SnapshotResponse::new(self.vote))
        }
    }

    fn follower(dir: &Path, vote: Vote, install_takes: Duration) -> Arc<Follower> {
        Arc::new(Follower {
            install_takes,
            dir: dir.to_path_buf(),
            vote,
            accepted: Mutex::default(),
            begun: Mutex::new(0),
            installed: Mutex::default(),
        })
    }

    /// Serves snapshot streams on loopback with `f`, each read and write within `ttl`; returns
    /// the address and a connector to reach it.
    async fn listen(dir: &Path, f: Arc<Follower>, ttl: Duration) -> (String, TlsConnector) {
        let m = material(dir);
        let acceptor = TlsAcceptor::from(Arc::new(m.rustls_server(&[ALPN]).expect("server")));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, f) = (acceptor.clone(), f.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve(&*f, tls, ttl).await;
                    }
                });
            }
        });
        let client = m.rustls_client(&[ALPN]).expect("client");
        (addr, TlsConnector::from(Arc::new(client)))
    }

    /// A leader's and a follower's directories under one temporary one, and the follower,
    /// holding `vote`, serving snapshot streams.
    struct Pair {
        _dir: tempfile::TempDir,
        send_dir: PathBuf,
        recv_dir: PathBuf,
        follower: Arc<Follower>,
        addr: String,
        connector: TlsConnector,
    }

    impl Pair {
        /// Sends the follower a snapshot of `data` with the leader's `vote`, within `ttl`.
        async fn send(&self, vote: Vote, data: &[u8], ttl: Duration) -> Sent {
            let snapshot = snapshot(&self.send_dir, data);
            send(&self.addr, 2, &self.connector, vote, snapshot, ttl).await
        }
    }

    async fn pair(vote: Vote) -> Pair {
        pair_with(vote, TTL, Duration::ZERO).await
    }

    /// As [`pair`], the follower serving within `ttl` and taking `install_takes` per install.
    async fn pair_with(vote: Vote, ttl: Duration, install_takes: Duration) -> Pair {
        let dir = tempfile::tempdir().expect("dir");
        let (send_dir, recv_dir) = (dir.path().join("leader"), dir.path().join("follower"));
        std::fs::create_dir_all(&send_dir).unwrap();
        std::fs::create_dir_all(&recv_dir).unwrap();
        let follower = follower(&recv_dir, vote, install_takes);
        let (addr, connector) = listen(dir.path(), follower.clone(), ttl).await;
        Pair {
            _dir: dir,
            send_dir,
            recv_dir,
            follower,
            addr,
            connector,
        }
    }

    fn meta() -> SnapshotMetadata {
        SnapshotMetadata {
            last_log_id: Some(crate::raft::LogId::new(
                openraft::CommittedLeaderId::new(3, 1),
                41,
            )),
            last_membership: Default::default(),
            snapshot_id: "3-41-0".into(),
        }
    }

    /// A snapshot whose data, `data`, follows a header in its file, as a member's own does.
    fn snapshot(dir: &Path, data: &[u8]) -> Snapshot<TypeConfig> {
        let path = dir.join("snapshot.bin");
        let mut file = b"HEADER".to_vec();
        file.extend_from_slice(data);
        std::fs::write(&path, file).expect("write");
        Snapshot {
            meta: meta(),
            snapshot: Box::new(SnapshotData::open(&path, 6).expect("open")),
        }
    }

    /// Files the follower received into that are still there.
    fn received(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("receiving"))
            .collect()
    }

    async fn until<F: Fn() -> bool>(what: &str, f: F) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_snapshot_arrives_whole_and_is_installed_with_the_leader_s_vote() {
        let p = pair(Vote::new_committed(3, 1)).await;
        let (f, recv_dir) = (&p.follower, &p.recv_dir);
        // More than two pieces, the last one short.
        let data: Vec<u8> = (0..(2 * PIECE + 12_345)).map(|i| (i % 251) as u8).collect();
        let leader_vote = Vote::new_committed(3, 1);
        let sent = p.send(leader_vote, &data, TTL).await.expect("sent");
        assert_eq!(sent.vote, f.vote);
        assert_eq!(
            *f.accepted.lock().unwrap(),
            [leader_vote],
            "the follower was not told its leader before the data"
        );
        {
            let installed = f.installed.lock().unwrap();
            assert_eq!(installed.len(), 1);
            let (vote, got_meta, bytes) = &installed[0];
            assert_eq!(*vote, leader_vote);
            assert_eq!(*got_meta, meta());
            assert_eq!(bytes.len(), data.len());
            assert!(
                *bytes == data,
                "the received data differs from the sent data"
            );
        }
        until("the received file is removed", || {
            received(recv_dir).is_empty()
        })
        .await;
    }

    #[tokio::test]
    async fn a_stream_cut_short_installs_nothing_and_leaves_no_file() {
        let p = pair(Vote::new_committed(3, 1)).await;
        let (f, recv_dir) = (&p.follower, &p.recv_dir);
        let mut conn = stream::connect(&p.addr, &p.connector, ALPN)
            .await
            .expect("connect");
        let head = Head {
            vote: Vote::new_committed(3, 1),
            meta: meta(),
            len: 10 * PIECE as u64,
        };
        let head = bincode::serialize(&head).unwrap();
        conn.write_all(&stream::frame(0, HEAD, &head))
            .await
            .unwrap();
        conn.flush().await.unwrap();
        let (_, outcome, _) = stream::read_frame(&mut conn)
            .await
            .unwrap()
            .expect("answer");
        assert_eq!(outcome, SEND);
        conn.write_all(&vec![7u8; PIECE + 100]).await.unwrap();
        conn.flush().await.unwrap();
        until("the follower began receiving", || {
            *f.begun.lock().unwrap() == 1
        })
        .await;
        // The leader gives up: the connection goes with the call.
        drop(conn);
        until("the received file is removed", || {
            received(recv_dir).is_empty()
        })
        .await;
        assert!(
            f.installed.lock().unwrap().is_empty(),
            "a partial snapshot was installed"
        );
    }

    #[tokio::test]
    async fn a_follower_with_a_higher_vote_answers_before_the_data() {
        let p = pair(Vote::new(4, 3)).await;
        let f = &p.follower;
        let sent = p
            .send(Vote::new_committed(3, 1), &[1u8; 5000], TTL)
            .await
            .expect("answered");
        assert_eq!(
            sent.vote,
            Vote::new(4, 3),
            "the follower's higher vote comes back"
        );
        assert_eq!(*f.begun.lock().unwrap(), 0, "data was received for nothing");
        assert!(f.installed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_install_that_outlasts_the_call_s_time_is_still_answered() {
        let ttl = Duration::from_millis(400);
        let p = pair_with(Vote::new_committed(3, 1), ttl, 4 * ttl).await;
        let f = &p.follower;
        let sent = p
            .send(Vote::new_committed(3, 1), &[5u8; 5000], ttl)
            .await
            .expect("answered after a long install");
        assert_eq!(sent.vote, f.vote);
        assert_eq!(f.installed.lock().unwrap().len(), 1);
    }
}
