//! Cluster DNS, served by every control-plane member (as CoreDNS's kubernetes plugin answers):
//!
//! - `<service>.<namespace>.svc.<domain>`: A (and AAAA) records of the Service's ClusterIPs; for
//!   a headless Service, of its ready endpoints;
//! - `_<port>._<protocol>.<service>.<namespace>.svc.<domain>`: SRV records of a named port;
//! - `<hostname>.<service>.<namespace>.svc.<domain>`: the ready endpoint with that hostname
//!   (a pod whose hostname and subdomain name it, as a StatefulSet's pods are);
//! - `<a-b-c-d>.<service>.<namespace>.svc.<domain>` (a headless Service's endpoint) and
//!   `<a-b-c-d>.<namespace>.pod.<domain>`: A records of that address;
//! - other names in the domain: NXDOMAIN; names outside it are forwarded to the upstream
//!   resolvers (the host's, from /etc/resolv.conf) and their answers relayed.
//!
//! It answers over UDP and TCP from this member's view of the store, through the API's
//! in-process client.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinEncodable};
use rkube_core::json::str_at as s;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::LocalClient as Client;

/// Records' time to live (CoreDNS's kubernetes plugin default).
const TTL: u32 = 5;

#[derive(Clone)]
pub struct DnsConfig {
    pub listen: SocketAddr,
    /// The cluster domain (`cluster.local`).
    pub domain: String,
    /// Where names outside the domain go.
    pub upstream: Vec<SocketAddr>,
}

/// The nameservers of a resolv.conf (port 53), for forwarding.
pub fn resolv_conf_servers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Serves DNS on UDP and TCP at `cfg.listen` until the process ends.
pub async fn serve(cfg: DnsConfig, client: Client) -> std::io::Result<()> {
    let udp = std::sync::Arc::new(tokio::net::UdpSocket::bind(cfg.listen).await?);
    let tcp = tokio::net::TcpListener::bind(cfg.listen).await?;
    let server = std::sync::Arc::new(Server { cfg, client });
    let s2 = server.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = tcp.accept().await else {
                continue;
            };
            let server = s2.clone();
            tokio::spawn(async move {
                // Each message is prefixed by its length (RFC 1035 4.2.2).
                loop {
                    let mut len = [0u8; 2];
                    if conn.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
                    if conn.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    let Some(answer) = server.answer(&buf).await else {
                        return;
                    };
                    let mut out = (answer.len() as u16).to_be_bytes().to_vec();
                    out.extend_from_slice(&answer);
                    if conn.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = match udp.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(_) => continue,
        };
        let query = buf[..n].to_vec();
        let (server, udp) = (server.clone(), udp.clone());
        tokio::spawn(async move {
            if let Some(mut answer) = server.answer(&query).await {
                // Over UDP an answer longer than 512 bytes is cut and marked truncated, so
                // the client asks again over TCP.
                if answer.len() > 512 {
                    if let Ok(mut m) = Message::from_bytes(&answer) {
                        m.take_answers();
                        m.set_truncated(true);
                        answer = m.to_bytes().unwrap_or_default();
                    }
                }
                let _ = udp.send_to(&answer, from).await;
            }
        });
    }
}

struct Server {
    cfg: DnsConfig,
    client: Client,
}

/// What a name in the cluster domain asks for.
#[derive(Debug, PartialEq)]
enum Query<'a> {
    Service {
        ns: &'a str,
        name: &'a str,
    },
    Srv {
        port: &'a str,
        proto: &'a str,
        ns: &'a str,
        name: &'a str,
    },
    Endpoint {
        ip: Ipv4Addr,
        ns: &'a str,
        name: &'a str,
    },
    /// `<hostname>.<service>`: the endpoint of that hostname (a StatefulSet's pod).
    Hostname {
        host: &'a str,
        ns: &'a str,
        name: &'a str,
    },
    Pod {
        ip: Ipv4Addr,
    },
    Unknown,
}

/// `a-b-c-d` as an address.
fn dashed(label: &str) -> Option<Ipv4Addr> {
    label.replace('-', ".").parse().ok()
}

/// The labels of `name` (lowercase, without the trailing dot) inside `domain`, parsed.
fn parse<'a>(labels: &'a [&'a str]) -> Query<'a> {
    match labels {
        [name, ns, "svc"] => Query::Service { ns, name },
        [port, proto, name, ns, "svc"] if port.starts_with('_') && proto.starts_with('_') => {
            Query::Srv {
                port: &port[1..],
                proto: &proto[1..],
                ns,
                name,
            }
        }
        [host, name, ns, "svc"] => match dashed(host) {
            Some(ip) => Query::Endpoint { ip, ns, name },
            None => Query::Hostname { host, ns, name },
        },
        [host, _ns, "pod"] => match dashed(host) {
            Some(ip) => Query::Pod { ip },
            None => Query::Unknown,
        },
        _ => Query::Unknown,
    }
}

impl Server {
    /// The response to one query message; None for what is not a query at all.
    async fn answer(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let req = Message::from_bytes(bytes).ok()?;
        if req.message_type() != MessageType::Query {
            return None;
        }
        let mut resp = Message::new();
        resp.set_id(req.id())
            .set_message_type(MessageType::Response)
            .set_op_code(req.op_code())
            .set_recursion_desired(req.recursion_desired())
            .set_recursion_available(true);
        resp.add_queries(req.queries().to_vec());
        let Some(q) = req.queries().first() else {
            resp.set_response_code(ResponseCode::FormErr);
            return resp.to_bytes().ok();
        };
        let full = q.name().to_lowercase().to_ascii();
        let full = full.trim_end_matches('.');
        let domain = self.cfg.domain.trim_end_matches('.');
        let Some(inside) = full.strip_suffix(domain).and_then(|r| r.strip_suffix('.')) else {
            if full == domain {
                resp.set_authoritative(true);
                return resp.to_bytes().ok();
            }
            return Some(self.forward(bytes, &req).await);
        };
        resp.set_authoritative(true);
        let labels: Vec<&str> = inside.split('.').collect();
        match self.records(parse(&labels), q.name(), q.query_type()).await {
            Ok(Some(records)) => {
                for r in records {
                    resp.add_answer(r);
                }
            }
            Ok(None) => {
                resp.set_response_code(ResponseCode::NXDomain);
            }
            Err(_) => {
                resp.set_response_code(ResponseCode::ServFail);
            }
        }
        resp.to_bytes().ok()
    }

    /// The records for a name in the domain: None when the name does not exist; an empty list
    /// when it exists without records of that type.
    async fn records(
        &self,
        query: Query<'_>,
        name: &Name,
        ty: RecordType,
    ) -> Result<Option<Vec<Record>>, crate::error::ApiError> {
        let addresses = |ips: Vec<IpAddr>| -> Vec<Record> {
            ips.into_iter()
                .filter_map(|ip| match (ip, ty) {
                    (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => {
                        Some(Record::from_rdata(name.clone(), TTL, RData::A(A(v4))))
                    }
                    (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => {
                        Some(Record::from_rdata(name.clone(), TTL, RData::AAAA(AAAA(v6))))
                    }
                    _ => None,
                })
                .collect()
        };
        match query {
            Query::Service { ns, name: svc } => {
                let Some(service) = self.service(ns, svc).await? else {
                    return Ok(None);
                };
                if s(&service, "/spec/clusterIP") == "None" {
                    let ips = self.ready_endpoints(ns, svc).await?;
                    return Ok(Some(addresses(ips)));
                }
                if s(&service, "/spec/type") == "ExternalName" {
                    return Ok(Some(Vec::new()));
                }
                let mut ips: Vec<IpAddr> = service
                    .pointer("/spec/clusterIPs")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(|x| x.as_str()?.parse().ok()).collect())
                    .unwrap_or_default();
                if ips.is_empty() {
                    ips.extend(s(&service, "/spec/clusterIP").parse::<IpAddr>().ok());
                }
                Ok(Some(addresses(ips)))
            }
            Query::Srv {
                port,
                proto,
                ns,
                name: svc,
            } => {
                let Some(service) = self.service(ns, svc).await? else {
                    return Ok(None);
                };
                let found = service
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .find(|p| {
                        s(p, "/name") == port
                            && match s(p, "/protocol") {
                                "" => proto == "tcp",
                                x => x.eq_ignore_ascii_case(proto),
                            }
                    })
                    .and_then(|p| p.get("port").and_then(Value::as_u64));
                let Some(number) = found else {
                    return Ok(None);
                };
                if !matches!(ty, RecordType::SRV | RecordType::ANY) {
                    return Ok(Some(Vec::new()));
                }
                let domain = &self.cfg.domain;
                let target = Name::from_ascii(format!("{svc}.{ns}.svc.{domain}."))
                    .map_err(|e| crate::error::ApiError::internal(e.to_string()))?;
                Ok(Some(vec![Record::from_rdata(
                    name.clone(),
                    TTL,
                    RData::SRV(SRV::new(0, 100, number as u16, target)),
                )]))
            }
            Query::Endpoint { ip, ns, name: svc } => {
                let ips = self.ready_endpoints(ns, svc).await?;
                if !ips.contains(&IpAddr::V4(ip)) {
                    return Ok(None);
                }
                Ok(Some(addresses(vec![IpAddr::V4(ip)])))
            }
            Query::Hostname {
                host,
                ns,
                name: svc,
            } => {
                let ips = self.ready_endpoints_named(ns, svc, Some(host)).await?;
                if ips.is_empty() {
                    return Ok(None);
                }
                Ok(Some(addresses(ips)))
            }
            Query::Pod { ip } => Ok(Some(addresses(vec![IpAddr::V4(ip)]))),
            Query::Unknown => Ok(None),
        }
    }

    async fn service(&self, ns: &str, name: &str) -> Result<Option<Value>, crate::error::ApiError> {
        match self
            .client
            .get(&format!("/api/v1/namespaces/{ns}/services/{name}"))
            .await
        {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ready addresses of a Service's EndpointSlices.
    async fn ready_endpoints(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Vec<IpAddr>, crate::error::ApiError> {
        self.ready_endpoints_named(ns, name, None).await
    }

    /// The ready addresses of a Service's EndpointSlices; only those of the endpoints with
    /// hostname `host` when it is given (a StatefulSet pod's `<host>.<service>` name).
    async fn ready_endpoints_named(
        &self,
        ns: &str,
        name: &str,
        host: Option<&str>,
    ) -> Result<Vec<IpAddr>, crate::error::ApiError> {
        let list = self
            .client
            .get(&format!(
                "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{name}"
            ))
            .await?;
        let mut ips: Vec<IpAddr> = list
            .pointer("/items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|slice| {
                slice
                    .pointer("/endpoints")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|ep| ep.pointer("/conditions/ready") != Some(&Value::Bool(false)))
            .filter(|ep| host.is_none_or(|h| s(ep, "/hostname") == h))
            .filter_map(|ep| ep.pointer("/addresses/0")?.as_str()?.parse().ok())
            .collect();
        ips.sort();
        ips.dedup();
        Ok(ips)
    }

    /// A query for a name outside the cluster: relayed to the first upstream that answers.
    async fn forward(&self, bytes: &[u8], req: &Message) -> Vec<u8> {
        for upstream in &self.cfg.upstream {
            let bind: SocketAddr = match upstream {
                SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let Ok(sock) = tokio::net::UdpSocket::bind(bind).await else {
                continue;
            };
            if sock.send_to(bytes, upstream).await.is_err() {
                continue;
            }
            let mut buf = vec![0u8; 4096];
            if let Ok(Ok((n, _))) =
                tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf)).await
            {
                return buf[..n].to_vec();
            }
        }
        let mut resp = Message::new();
        resp.set_id(req.id())
            .set_message_type(MessageType::Response)
            .set_op_code(req.op_code())
            .set_recursion_desired(req.recursion_desired())
            .set_response_code(ResponseCode::ServFail);
        resp.add_queries(req.queries().to_vec());
        resp.to_bytes().unwrap_or_default()
    }
}

/// Who manages the EndpointSlices a member publishes for itself.
pub const MEMBER_MANAGER: &str = "rkube-server";
/// The prefix of the Lease each member renews in kube-system while it serves the API
/// (kube-apiserver's identity leases are named so).
pub const MEMBER_LEASE_PREFIX: &str = "kube-apiserver-";
/// How often a member renews its Lease and checks its EndpointSlices.
pub const MEMBER_RENEW: Duration = Duration::from_secs(5);
/// How long a member's Lease may go unrenewed before its endpoints are taken out (the
/// master lease TTL of kube-apiserver's lease reconciler).
pub const MEMBER_LEASE_SECONDS: u64 = 15;

/// Publishes where this member serves the Kubernetes API (and DNS), for as long as it runs:
/// its Lease `kube-system/kube-apiserver-<member>`, renewed every [`MEMBER_RENEW`], and its
/// own EndpointSlices for the `default/kubernetes` and `kube-system/kube-dns` Services
/// (`<service>-<member>`), which have no selector, so that Services carry pods' traffic to
/// every member; a slice deleted meanwhile (the leader takes out members whose Lease stopped)
/// is made again. Addresses no pod can reach (loopback, unspecified) are not published.
pub async fn publish_member(
    client: Client,
    member: String,
    api: SocketAddr,
    dns: Option<SocketAddr>,
) {
    let reachable = |a: &SocketAddr| !a.ip().is_loopback() && !a.ip().is_unspecified();
    let mut wanted = Vec::new();
    if reachable(&api) {
        wanted.push(("default", "kubernetes", api, vec![("https", "TCP")]));
    }
    if let Some(dns) = dns.filter(reachable) {
        wanted.push((
            "kube-system",
            "kube-dns",
            dns,
            vec![("dns", "UDP"), ("dns-tcp", "TCP")],
        ));
    }
    let slices: Vec<(String, Value)> = wanted
        .into_iter()
        .map(|(ns, service, addr, ports)| {
            let name = format!("{service}-{member}");
            let slice = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": ns,
                             "labels": {"kubernetes.io/service-name": service,
                                        "endpointslice.kubernetes.io/managed-by": MEMBER_MANAGER}},
                "addressType": if addr.is_ipv4() { "IPv4" } else { "IPv6" },
                "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}],
                "ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": addr.port(), "protocol": p})).collect::<Vec<_>>(),
            });
            (format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{name}"), slice)
        })
        .collect();
    let lease_path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{MEMBER_LEASE_PREFIX}{member}"
    );
    let mut tick = tokio::time::interval(MEMBER_RENEW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = renew_lease(&client, &lease_path, &member).await {
            tracing::debug!(error = %e, "renewing this member's Lease failed; retrying");
            continue;
        }
        for (path, slice) in &slices {
            if let Err(e) = ensure(&client, path, slice).await {
                tracing::debug!(error = %e, path, "publishing this member's endpoints failed; retrying");
            }
        }
    }
}

async fn renew_lease(
    client: &Client,
    path: &str,
    member: &str,
) -> Result<(), crate::error::ApiError> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let spec = serde_json::json!({"holderIdentity": member,
        "leaseDurationSeconds": MEMBER_LEASE_SECONDS, "renewTime": now});
    match client.get(path).await {
        Ok(mut lease) => {
            lease["spec"] = spec;
            client.update(path, &lease).await.map(|_| ())
        }
        Err(e) if e.code == 404 => {
            let (collection, name) = path.rsplit_once('/').unwrap_or((path, ""));
            let lease = serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-system",
                             "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver",
                                        "kubernetes.io/hostname": member}},
                "spec": spec,
            });
            client.create(collection, &lease).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}

/// Creates the slice at `path`, or puts back what it should hold when it was changed.
async fn ensure(client: &Client, path: &str, slice: &Value) -> Result<(), crate::error::ApiError> {
    match client.get(path).await {
        Ok(current) => {
            let same = ["addressType", "endpoints", "ports"]
                .iter()
                .all(|f| current.get(*f) == slice.get(*f));
            if same {
                return Ok(());
            }
            let mut update = slice.clone();
            update["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            client.update(path, &update).await.map(|_| ())
        }
        Err(e) if e.code == 404 => {
            let collection = path.rsplit_once('/').map(|(c, _)| c).unwrap_or(path);
            match client.create(collection, slice).await {
                Ok(_) => Ok(()),
                Err(e) if e.code == 409 => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_the_cluster_domain() {
        assert_eq!(
            parse(&["backend", "default", "svc"]),
            Query::Service {
                ns: "default",
                name: "backend"
            }
        );
        assert_eq!(
            parse(&["_http", "_tcp", "backend", "dev", "svc"]),
            Query::Srv {
                port: "http",
                proto: "tcp",
                ns: "dev",
                name: "backend"
            }
        );
        assert_eq!(
            parse(&["10-244-1-5", "db", "default", "svc"]),
            Query::Endpoint {
                ip: "10.244.1.5".parse().unwrap(),
                ns: "default",
                name: "db"
            }
        );
        assert_eq!(
            parse(&["10-244-1-5", "default", "pod"]),
            Query::Pod {
                ip: "10.244.1.5".parse().unwrap()
            }
        );
        assert_eq!(
            parse(&["web-0", "nginx", "default", "svc"]),
            Query::Hostname {
                host: "web-0",
                ns: "default",
                name: "nginx"
            }
        );
        assert_eq!(parse(&["backend", "svc"]), Query::Unknown);
        assert_eq!(parse(&["backend"]), Query::Unknown);
    }

    #[test]
    fn upstreams_from_resolv_conf() {
        let text =
            "# generated\nsearch example\nnameserver 192.0.2.53\nnameserver ::1\noptions ndots:1\n";
        assert_eq!(
            resolv_conf_servers(text),
            vec![
                "192.0.2.53:53".parse::<SocketAddr>().unwrap(),
                "[::1]:53".parse().unwrap()
            ]
        );
    }
}
