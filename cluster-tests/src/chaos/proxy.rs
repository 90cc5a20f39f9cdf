//! Fault proxies: every member's peer address, as the other members know it, is a proxy on
//! this machine that forwards to the member's real peer port. A connection's source address
//! tells the proxy which member opened it, so the traffic of every link (from member a to
//! member b, one direction) can be cut, delayed or made lossy on its own.
//!
//! A link's fault applies to the bytes flowing in its direction, whichever side opened the
//! connection: cutting a -> b silences a's requests on the connections a opens to b and a's
//! answers on the connections b opens to a. Bytes of a cut direction are discarded, as
//! dropped packets would be, and the other side hears nothing. Whenever a link's fault changes,
//! the connections over it are closed (a partition ends connections by timeout, a heal starts
//! fresh ones), so no stream ever resumes with bytes missing.
//!
//! Loss is TCP's view of dropped packets: a stalled chunk (a 200 ms retransmission) with the
//! given probability, and now and then a reset connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;

use super::net::Hosts;

/// What happens to the bytes one link carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinkFault {
    Cut,
    Delay(Duration),
    /// Probability (0..1) that a chunk is lost once (retransmitted 200 ms later).
    Loss(f64),
}

/// The faults of every link, (from, to) -> fault; absent: healthy.
#[derive(Default)]
struct Links {
    faults: Mutex<HashMap<(usize, usize), LinkFault>>,
}

impl Links {
    fn get(&self, from: usize, to: usize) -> Option<LinkFault> {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(from, to))
            .copied()
    }
}

pub struct FaultProxies {
    links: Arc<Links>,
    /// Bumped on every change; connections check whether their links' faults changed.
    epoch: watch::Sender<u64>,
    /// Member i's peer address as the members know it.
    pub addrs: Vec<SocketAddr>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Which member a connection came from: known from its source address; anything else
/// (this machine) is `usize::MAX`, a link never faulted.
const OUTSIDE: usize = usize::MAX;

impl FaultProxies {
    /// A proxy per member at the bridge address of this machine, on `base_port + i`,
    /// forwarding to `targets[i]`.
    pub async fn start(hosts: &Hosts, base_port: u16, targets: Vec<SocketAddr>) -> Result<Self> {
        let links = Arc::new(Links::default());
        let (epoch, _) = watch::channel(0u64);
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for (i, target) in targets.into_iter().enumerate() {
            let addr = SocketAddr::new(IpAddr::V4(hosts.host_ip()), base_port + i as u16);
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("fault proxy of member {i} on {addr}"))?;
            addrs.push(addr);
            let sources: Vec<(IpAddr, usize)> = (0..hosts.members)
                .map(|j| (IpAddr::V4(hosts.member_ip(j)), j))
                .collect();
            let (links, epoch) = (links.clone(), epoch.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((conn, from)) = listener.accept().await else {
                        continue;
                    };
                    let src = sources
                        .iter()
                        .find(|(ip, _)| *ip == from.ip())
                        .map_or(OUTSIDE, |(_, j)| *j);
                    let _ = conn.set_nodelay(true);
                    tokio::spawn(carry(
                        conn,
                        src,
                        i,
                        target,
                        links.clone(),
                        epoch.subscribe(),
                    ));
                }
            }));
        }
        Ok(Self {
            links,
            epoch,
            addrs,
            tasks,
        })
    }

    /// Sets (Some) or heals (None) the link from `from` to `to`.
    pub fn set(&self, from: usize, to: usize, fault: Option<LinkFault>) {
        {
            let mut faults = self.links.faults.lock().unwrap_or_else(|e| e.into_inner());
            match fault {
                Some(f) => faults.insert((from, to), f),
                None => faults.remove(&(from, to)),
            };
        }
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Every link healthy again.
    pub fn heal(&self) {
        self.links
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Faults every link between `member` and the `others`: outgoing, incoming, or both.
    pub fn isolate(&self, member: usize, others: &[usize], out: bool, inc: bool, f: LinkFault) {
        for &o in others.iter().filter(|o| **o != member) {
            if out {
                self.set(member, o, Some(f));
            }
            if inc {
                self.set(o, member, Some(f));
            }
        }
    }
}

impl Drop for FaultProxies {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Carries one connection from member `src` to member `dst` until it ends or a fault of
/// either direction changes.
async fn carry(
    conn: TcpStream,
    src: usize,
    dst: usize,
    target: SocketAddr,
    links: Arc<Links>,
    mut epoch: watch::Receiver<u64>,
) {
    let faults = |links: &Links| (links.get(src, dst), links.get(dst, src));
    let start = faults(&links);
    let changed = async {
        while epoch.changed().await.is_ok() {
            if faults(&links) != start {
                return;
            }
        }
    };
    let (forward, backward) = start;
    let work = async {
        let (cr, cw) = conn.into_split();
        if forward == Some(LinkFault::Cut) {
            // Nothing of src's reaches dst: no connection to dst at all; src's bytes vanish.
            return discard(cr).await;
        }
        let Ok(Ok(up)) =
            tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(target)).await
        else {
            return;
        };
        let _ = up.set_nodelay(true);
        let (ur, uw) = up.into_split();
        tokio::select! {
            _ = pump(cr, uw, forward) => {}
            _ = pump(ur, cw, backward) => {}
        }
    };
    tokio::select! {
        _ = changed => {}
        _ = work => {}
    }
}

async fn discard(mut r: tokio::net::tcp::OwnedReadHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Copies one direction, applying its fault; returns when either side ends.
async fn pump(
    mut r: tokio::net::tcp::OwnedReadHalf,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    fault: Option<LinkFault>,
) {
    if fault == Some(LinkFault::Cut) {
        return discard(r).await;
    }
    // Chunks with the time each is due, written in order by the writer.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if w.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_due = Instant::now();
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let now = Instant::now();
            let due = match fault {
                Some(LinkFault::Delay(d)) => now + d,
                Some(LinkFault::Loss(p)) => {
                    if rand::random::<f64>() < p / 20.0 {
                        return; // a reset: too many losses in a row
                    }
                    if rand::random::<f64>() < p {
                        now + Duration::from_millis(200)
                    } else {
                        now
                    }
                }
                _ => now,
            }
            .max(last_due);
            last_due = due;
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        _ = reader => {}
    }
}
