//! The control-plane endpoint: one address for people and tools that stays up while a quorum
//! does, as kube-vip's virtual IP is.
//!
//! The member that leads with a quorum behind it holds the endpoint: it listens on the
//! endpoint's API and client (etcd) addresses and hands what it accepts there to its own
//! Kubernetes API and etcd servers, so a connection to the endpoint is served exactly as one
//! to the member's own ports (same TLS, same handlers, no proxy in between). When it stops
//! leading, or hears nothing from a quorum for an election timeout (cut off from the others),
//! it closes those listeners; a member killed outright closes them with its process. The next
//! leader takes them up.
//!
//! Letting go of an address on an interface also cuts the connections accepted at it, before the
//! address comes off: a connection closed after that sends its FIN from an address the host no
//! longer has, which never leaves it, and a client that only reads (a watch) would wait on it
//! forever. (Without an interface the address stays local, and so do its connections.)
//!
//! With an interface (`--vip-interface`), the holder also puts the address on it and announces
//! it with gratuitous ARP, so that the other hosts of the network send to the new holder at
//! once; it takes the address off again when it lets go. Without one the address must already
//! be local (as a loopback or bridge address is for members sharing one host in `rkube up`).

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};

use super::node::Node;

/// Where the endpoint is.
#[derive(Debug, Clone, Default)]
pub struct EndpointConfig {
    /// The Kubernetes API at the endpoint.
    pub api: Option<SocketAddr>,
    /// The etcd v3 API at the endpoint.
    pub client: Option<SocketAddr>,
    /// The interface the holder puts the endpoint's address on (and announces it on).
    pub interface: Option<String>,
}

impl EndpointConfig {
    /// The endpoint's address; an error when its two ports name different ones.
    pub fn address(&self) -> Result<Option<IpAddr>, String> {
        match (self.api, self.client) {
            (Some(a), Some(c)) if a.ip() != c.ip() => Err(format!(
                "the control-plane endpoint is one address: --vip-api {a} and --vip-client {c} differ"
            )),
            (Some(a), _) => Ok(Some(a.ip())),
            (None, Some(c)) => Ok(Some(c.ip())),
            (None, None) => Ok(None),
        }
    }
}

/// Connections accepted at the endpoint, for the server of the port they arrived on.
pub type Connections = mpsc::Receiver<Connection>;

/// How long letting go waits for the servers to close the endpoint's connections before the
/// address comes off.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// A TCP connection a server accepted: on the member's own port, or at the endpoint. One at
/// an endpoint on an interface fails its reads and writes once the member lets go of the
/// endpoint, so that the server serving it closes it while the address is still there to send
/// the FIN from.
pub struct Connection {
    stream: TcpStream,
    /// Resolves when the member lets go of the endpoint the connection arrived at.
    released: Option<watch::Receiver<()>>,
    /// `released`, as polled by reads and writes.
    cut: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    gone: bool,
    /// Counts the endpoint's open connections, for letting go.
    _open: Option<Arc<()>>,
}

impl Connection {
    /// A connection to the member's own port: never cut.
    pub fn own(stream: TcpStream) -> Self {
        Connection {
            stream,
            released: None,
            cut: None,
            gone: false,
            _open: None,
        }
    }

    fn at_endpoint(stream: TcpStream, released: watch::Receiver<()>, open: Arc<()>) -> Self {
        Connection {
            stream,
            cut: Some(Box::pin(until_released(released.clone()))),
            released: Some(released),
            gone: false,
            _open: Some(open),
        }
    }

    /// Resolves when the member lets go of the endpoint this connection arrived at; never for
    /// a connection to the member's own port.
    pub fn released(&self) -> impl Future<Output = ()> + Send + 'static {
        let released = self.released.clone();
        async move {
            match released {
                Some(r) => until_released(r).await,
                None => std::future::pending().await,
            }
        }
    }

    /// An error once the connection is cut; registers the task to be woken when it is.
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if !self.gone {
            if let Some(cut) = &mut self.cut {
                self.gone = cut.as_mut().poll(cx).is_ready();
            }
        }
        self.gone.then(|| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "this member let go of the control-plane endpoint",
            )
        })
    }
}

/// Until the holder lets go: nothing is ever sent, so this ends when the sender is dropped
/// with its hold.
async fn until_released(mut released: watch::Receiver<()>) {
    let _ = released.changed().await;
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Some(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// The listeners of a held endpoint; dropping it closes them and cuts the connections they
/// accepted.
struct Held {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Dropped with the hold: every connection accepted at the endpoint is cut.
    _release: watch::Sender<()>,
    /// One count per open connection accepted at the endpoint, and this one.
    open: Arc<()>,
}

impl Held {
    /// Lets go: closes the listeners, cuts the connections, and waits (at most `CLOSE_WAIT`)
    /// until the servers have closed them.
    async fn let_go(self) {
        let open = self.open.clone();
        drop(self);
        let deadline = Instant::now() + CLOSE_WAIT;
        while Arc::strong_count(&open) > 1 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Whether this member should hold the endpoint: it leads, and a quorum answered it within an
/// election timeout.
fn should_hold(node: &Node) -> bool {
    let m = node.raft.metrics();
    let m = m.borrow();
    let leads = m.state == openraft::ServerState::Leader && m.current_leader == Some(node.id);
    let recent = m
        .millis_since_quorum_ack
        .is_some_and(|ms| u128::from(ms) <= node.timing.election_timeout.as_millis());
    leads && recent
}

/// Runs the endpoint for `node` until `stop`: connections to `cfg.api` go to `api`, to
/// `cfg.client` to `client`.
pub async fn run(
    node: Arc<Node>,
    cfg: EndpointConfig,
    api: Option<mpsc::Sender<Connection>>,
    client: Option<mpsc::Sender<Connection>>,
    mut stop: watch::Receiver<bool>,
) {
    let Ok(Some(ip)) = cfg.address() else {
        return;
    };
    // A twentieth of the election timeout: the endpoint moves within that of the leadership.
    let tick = (node.timing.election_timeout / 20).max(Duration::from_millis(10));
    let mut held: Option<Held> = None;
    let mut warned = false;
    loop {
        let hold = should_hold(&node);
        if hold && held.is_none() {
            match acquire(&cfg, ip, api.clone(), client.clone()).await {
                Ok(h) => {
                    tracing::info!(address = %ip, "holding the control-plane endpoint");
                    node.metrics.endpoint_held.set(1);
                    held = Some(h);
                    warned = false;
                }
                // Typically the last holder, still alive, has not let go yet: try again.
                Err(e) if !warned => {
                    tracing::warn!(address = %ip, error = %e, "cannot take the control-plane endpoint yet");
                    warned = true;
                }
                Err(_) => {}
            }
        } else if !hold {
            if let Some(h) = held.take() {
                h.let_go().await;
                release(&cfg, ip);
                node.metrics.endpoint_held.set(0);
                tracing::info!(address = %ip, "let go of the control-plane endpoint");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => break,
        }
    }
    if let Some(h) = held.take() {
        h.let_go().await;
        release(&cfg, ip);
        node.metrics.endpoint_held.set(0);
    }
}

async fn acquire(
    cfg: &EndpointConfig,
    ip: IpAddr,
    api: Option<mpsc::Sender<Connection>>,
    client: Option<mpsc::Sender<Connection>>,
) -> io::Result<Held> {
    if let (Some(iface), IpAddr::V4(v4)) = (&cfg.interface, ip) {
        net::add_address(iface, v4)?;
        // Announce the new holder; a few times, as a lost frame leaves a neighbour stale, and
        // for longer than the last holder may keep the address while its connections close
        // (`CLOSE_WAIT`), as it answers ARP for it until then.
        let (iface, v4) = (iface.clone(), v4);
        tokio::spawn(async move {
            let until = Instant::now() + CLOSE_WAIT + Duration::from_millis(500);
            while Instant::now() < until {
                if let Err(e) = net::gratuitous_arp(&iface, v4) {
                    tracing::warn!(interface = %iface, error = %e, "gratuitous ARP failed");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }
    let (release, released) = watch::channel(());
    let open = Arc::new(());
    let mut tasks = Vec::new();
    for (addr, to) in [(cfg.api, api), (cfg.client, client)] {
        let (Some(addr), Some(to)) = (addr, to) else {
            continue;
        };
        let listener = listen(addr)?;
        let cut = cfg.interface.is_some() && ip.is_ipv4();
        let (released, open) = (released.clone(), open.clone());
        tasks.push(tokio::spawn(accept(listener, to, cut, released, open)));
    }
    Ok(Held {
        tasks,
        _release: release,
        open,
    })
}

fn release(cfg: &EndpointConfig, ip: IpAddr) {
    if let (Some(iface), IpAddr::V4(v4)) = (&cfg.interface, ip) {
        if let Err(e) = net::remove_address(iface, v4) {
            tracing::warn!(interface = %iface, address = %v4, error = %e, "cannot take the endpoint's address off");
        }
    }
}

fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // The last holder's connections may linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn accept(
    listener: TcpListener,
    to: mpsc::Sender<Connection>,
    cut: bool,
    released: watch::Receiver<()>,
    open: Arc<()>,
) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let _ = conn.set_nodelay(true);
                let conn = match cut {
                    true => Connection::at_endpoint(conn, released.clone(), open.clone()),
                    false => Connection::own(conn),
                };
                if to.send(conn).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting at the control-plane endpoint failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Putting an IPv4 address on an interface and announcing it: rtnetlink and a raw ARP frame.
mod net {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    fn ifindex(iface: &str) -> io::Result<u32> {
        let name = CString::new(iface)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface name has a NUL"))?;
        match unsafe { libc::if_nametoindex(name.as_ptr()) } {
            0 => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no interface {iface:?}"),
            )),
            i => Ok(i),
        }
    }

    /// Adds `ip/32` to `iface`; present already is fine.
    pub fn add_address(iface: &str, ip: Ipv4Addr) -> io::Result<()> {
        let flags = libc::NLM_F_CREATE | libc::NLM_F_REPLACE;
        address_request(libc::RTM_NEWADDR, flags, iface, ip)
    }

    /// Removes `ip/32` from `iface`; absent already is fine.
    pub fn remove_address(iface: &str, ip: Ipv4Addr) -> io::Result<()> {
        match address_request(libc::RTM_DELADDR, 0, iface, ip) {
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            r => r,
        }
    }

    /// One RTM_NEWADDR or RTM_DELADDR request (nlmsghdr, ifaddrmsg, IFA_LOCAL and IFA_ADDRESS
    /// attributes), and its acknowledgement.
    fn address_request(kind: u16, flags: libc::c_int, iface: &str, ip: Ipv4Addr) -> io::Result<()> {
        let index = ifindex(iface)?;
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })?;
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut msg = Vec::with_capacity(40);
        msg.extend_from_slice(&40u32.to_ne_bytes());
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(
            &((libc::NLM_F_REQUEST | libc::NLM_F_ACK | flags) as u16).to_ne_bytes(),
        );
        msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        msg.extend_from_slice(&[libc::AF_INET as u8, 32, 0, 0]); // family, prefix, flags, scope
        msg.extend_from_slice(&index.to_ne_bytes());
        for attr in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
            msg.extend_from_slice(&8u16.to_ne_bytes());
            msg.extend_from_slice(&attr.to_ne_bytes());
            msg.extend_from_slice(&ip.octets());
        }
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as u16;
        cvt(unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ) as libc::c_int
        })?;
        let mut reply = [0u8; 512];
        let n = cvt(unsafe {
            libc::recv(fd.as_raw_fd(), reply.as_mut_ptr().cast(), reply.len(), 0) as libc::c_int
        })? as usize;
        // nlmsghdr (16 bytes) of type NLMSG_ERROR, then the error code (0 acknowledges).
        if n < 20 || u16::from_ne_bytes([reply[4], reply[5]]) != libc::NLMSG_ERROR as u16 {
            return Err(io::Error::other("unexpected netlink reply"));
        }
        match i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]) {
            0 => Ok(()),
            e => Err(io::Error::from_raw_os_error(-e)),
        }
    }

    /// Broadcasts an ARP request for `ip` from `ip` itself with `iface`'s hardware address, so
    /// that hosts on the link point the address at this one.
    pub fn gratuitous_arp(iface: &str, ip: Ipv4Addr) -> io::Result<()> {
        let index = ifindex(iface)?;
        let mac = hardware_address(iface)?;
        let proto = (libc::ETH_P_ARP as u16).to_be();
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::c_int::from(proto),
            )
        })?;
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut frame = Vec::with_capacity(42);
        frame.extend_from_slice(&[0xff; 6]);
        frame.extend_from_slice(&mac);
        frame.extend_from_slice(&(libc::ETH_P_ARP as u16).to_be_bytes());
        frame.extend_from_slice(&1u16.to_be_bytes()); // Ethernet
        frame.extend_from_slice(&(libc::ETH_P_IP as u16).to_be_bytes());
        frame.extend_from_slice(&[6, 4]);
        frame.extend_from_slice(&1u16.to_be_bytes()); // request
        frame.extend_from_slice(&mac);
        frame.extend_from_slice(&ip.octets());
        frame.extend_from_slice(&[0; 6]);
        frame.extend_from_slice(&ip.octets());
        let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        to.sll_family = libc::AF_PACKET as u16;
        to.sll_protocol = proto;
        to.sll_ifindex = index as i32;
        to.sll_halen = 6;
        to.sll_addr[..6].copy_from_slice(&[0xff; 6]);
        cvt(unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&to as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            ) as libc::c_int
        })?;
        Ok(())
    }

    fn hardware_address(iface: &str) -> io::Result<[u8; 6]> {
        let text = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))?;
        let bytes = text
            .trim()
            .split(':')
            .map(|b| u8::from_str_radix(b, 16))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        bytes.try_into().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{iface} has no Ethernet address"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_one_address() {
        let cfg = |api: &str, client: &str| EndpointConfig {
            api: api.parse().ok(),
            client: client.parse().ok(),
            interface: None,
        };
        assert_eq!(
            cfg("10.0.0.5:6443", "10.0.0.5:2379").address(),
            Ok(Some("10.0.0.5".parse().unwrap()))
        );
        assert_eq!(cfg("", "").address(), Ok(None));
        assert!(cfg("10.0.0.5:6443", "10.0.0.6:2379")
            .address()
            .unwrap_err()
            .contains("one address"));
    }

    #[tokio::test]
    async fn letting_go_cuts_the_connections_accepted_at_the_endpoint() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (to, mut accepted) = mpsc::channel(4);
        let (release, released) = watch::channel(());
        let open = Arc::new(());
        let task = tokio::spawn(accept(listener, to, true, released, open.clone()));
        let held = Held {
            tasks: vec![task],
            _release: release,
            open,
        };
        // A client that only reads, as a watch does, and a server that answers one request
        // and then waits for the next, as an idle HTTP/1.1 connection does.
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut conn = accepted.recv().await.expect("a connection at the endpoint");
        let server = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            conn.write_all(b"hello").await.unwrap();
            // Ends only when the connection is cut; dropping `conn` closes it.
            let read = conn.read(&mut buf).await;
            assert!(read.is_err(), "the cut connection reads an error: {read:?}");
        });
        let mut buf = [0u8; 5];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
        assert!(!server.is_finished());
        held.let_go().await;
        // The server closed the connection: the client reads its end.
        let eof = tokio::time::timeout(Duration::from_secs(30), client.read(&mut buf)).await;
        assert!(
            matches!(eof, Ok(Ok(0))),
            "the client sees the close: {eof:?}"
        );
        server.await.expect("the server saw the cut");
        // A connection to the member's own port is never cut.
        let own = Connection::own(client);
        let never = tokio::time::timeout(Duration::from_millis(50), own.released()).await;
        assert!(never.is_err());
    }

    /// Whether `ip` is on some interface of this thread's network namespace.
    fn has_address(ip: Ipv4Addr) -> bool {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        assert_eq!(unsafe { libc::getifaddrs(&mut list) }, 0);
        let mut found = false;
        let mut cur = list;
        while !cur.is_null() {
            let entry = unsafe { &*cur };
            if !entry.ifa_addr.is_null()
                && i32::from(unsafe { (*entry.ifa_addr).sa_family }) == libc::AF_INET
            {
                let sin = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
                found |= u32::from_be(sin.sin_addr.s_addr) == u32::from(ip);
            }
            cur = entry.ifa_next;
        }
        unsafe { libc::freeifaddrs(list) };
        found
    }

    #[test]
    fn the_holder_puts_the_address_on_the_interface_and_takes_it_off() {
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: changing a network namespace's addresses needs root");
            return;
        }
        std::thread::spawn(|| {
            // A network namespace of this thread's own: the host's interfaces stay untouched.
            assert_eq!(
                unsafe { libc::unshare(libc::CLONE_NEWNET) },
                0,
                "unshare: {}",
                io::Error::last_os_error()
            );
            let ip = Ipv4Addr::new(10, 77, 0, 9);
            assert!(!has_address(ip));
            net::add_address("lo", ip).expect("the address goes on");
            net::add_address("lo", ip).expect("holding it again is fine");
            assert!(has_address(ip), "the address is on lo");
            net::remove_address("lo", ip).expect("the address comes off");
            assert!(!has_address(ip), "the address is off lo");
            net::remove_address("lo", ip).expect("letting go twice is fine");
            let err = net::add_address("nosuch0", ip).unwrap_err();
            assert!(err.to_string().contains("nosuch0"), "{err}");
        })
        .join()
        .expect("the namespace thread passes");
    }
}
