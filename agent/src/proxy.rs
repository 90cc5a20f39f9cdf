//! The node's service proxy, as kube-proxy's iptables mode does it: the agent follows Services
//! and EndpointSlices and programs the node's nat and filter tables so that traffic to a
//! Service's ClusterIP (and its NodePort on every node address, and its load-balancer
//! addresses) reaches one of its ready endpoints, chosen at random (or kept per client with
//! `sessionAffinity: ClientIP`). A Service without ready endpoints rejects connections at once.
//!
//! The whole rule set is rendered from the current objects and handed to `iptables-restore` in
//! one go (`--noflush`, touching only rkube's own chains, which are rewritten whole), so the
//! node is never half-programmed; nothing is written when the rendering did not change. Chains
//! left by an earlier run (a restarted agent) or by Services that went are deleted in the same
//! restore.
//!
//! Traffic to a Service is masqueraded (its source becomes the node's address) so that replies
//! come back through the node whichever bridge or host the endpoint is on; with
//! `externalTrafficPolicy: Local`, NodePort and load-balancer traffic goes only to the node's own
//! endpoints and keeps its client's address.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use rkube_core::json::str_at as s;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::join::Clients;

/// The mark that asks POSTROUTING to masquerade, as kube-proxy's.
const MASQ_MARK: &str = "0x4000/0x4000";
/// How long a client sticks to its endpoint with sessionAffinity ClientIP (Kubernetes' default).
const DEFAULT_AFFINITY_SECONDS: i64 = 10800;

/// The strings of an array field (absent: none).
fn strings(v: &Value, p: &str) -> Vec<String> {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One port of one Service, as the proxy programs it.
#[derive(Debug, Clone, PartialEq)]
struct ServicePort {
    /// `namespace/name:port-name`.
    id: String,
    protocol: String,
    port: i64,
    node_port: i64,
    cluster_ips: Vec<String>,
    external_ips: Vec<String>,
    /// The load-balancer addresses among them (announced by one node).
    lb_ips: Vec<String>,
    /// The nodes of the ready endpoints, sorted.
    endpoint_nodes: Vec<String>,
    local_only: bool,
    affinity: Option<i64>,
    /// Ready endpoints: (address, port, on this node).
    endpoints: Vec<(String, i64, bool)>,
}

/// The Services' ports with their ready endpoints, from the objects as the API has them.
fn service_ports(
    services: &HashMap<String, Value>,
    slices: &HashMap<String, Value>,
    node: &str,
) -> Vec<ServicePort> {
    // EndpointSlices by their Service (namespace/name).
    let mut by_service: HashMap<String, Vec<&Value>> = HashMap::new();
    for slice in slices.values() {
        let svc = s(slice, "/metadata/labels/kubernetes.io~1service-name");
        if !svc.is_empty() {
            let key = format!("{}/{svc}", s(slice, "/metadata/namespace"));
            by_service.entry(key).or_default().push(slice);
        }
    }
    let mut out = Vec::new();
    for svc in services.values() {
        let ns = s(svc, "/metadata/namespace");
        let name = s(svc, "/metadata/name");
        let ty = s(svc, "/spec/type");
        let cluster_ip = s(svc, "/spec/clusterIP");
        // Headless and ExternalName Services have no virtual address to program.
        if ty == "ExternalName" || cluster_ip.is_empty() || cluster_ip == "None" {
            continue;
        }
        let mut cluster_ips = strings(svc, "/spec/clusterIPs");
        if cluster_ips.is_empty() {
            cluster_ips.push(cluster_ip.to_string());
        }
        cluster_ips.retain(|ip| !ip.contains(':')); // IPv4 rules only
        let mut external_ips = strings(svc, "/spec/externalIPs");
        let lb_ips: Vec<String> = svc
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|i| s(i, "/ip").to_string())
                    .filter(|ip| !ip.is_empty() && !ip.contains(':'))
                    .collect()
            })
            .unwrap_or_default();
        external_ips.extend(lb_ips.iter().cloned());
        let local_only = s(svc, "/spec/externalTrafficPolicy") == "Local";
        let affinity = (s(svc, "/spec/sessionAffinity") == "ClientIP").then(|| {
            svc.pointer("/spec/sessionAffinityConfig/clientIP/timeoutSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(DEFAULT_AFFINITY_SECONDS)
        });
        let slices = by_service.get(&format!("{ns}/{name}"));
        for p in svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let port_name = s(p, "/name");
            let protocol = match s(p, "/protocol") {
                "" => "TCP",
                x => x,
            };
            let mut endpoints = Vec::new();
            let mut endpoint_nodes = Vec::new();
            for slice in slices.into_iter().flatten() {
                if s(slice, "/addressType") != "IPv4" {
                    continue;
                }
                let Some(target) = slice
                    .pointer("/ports")
                    .and_then(Value::as_array)
                    .and_then(|ps| {
                        ps.iter().find(|sp| {
                            s(sp, "/name") == port_name
                                && (s(sp, "/protocol") == protocol || s(sp, "/protocol").is_empty())
                        })
                    })
                    .and_then(|sp| sp.get("port").and_then(Value::as_i64))
                else {
                    continue;
                };
                for ep in slice
                    .pointer("/endpoints")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    // Ready is true when unset, as the API defines it.
                    if ep.pointer("/conditions/ready") == Some(&Value::Bool(false)) {
                        continue;
                    }
                    let local = s(ep, "/nodeName") == node;
                    if let Some(addr) = ep.pointer("/addresses/0").and_then(Value::as_str) {
                        endpoints.push((addr.to_string(), target, local));
                        endpoint_nodes.push(s(ep, "/nodeName").to_string());
                    }
                }
            }
            endpoints.sort();
            endpoints.dedup();
            endpoint_nodes.sort();
            endpoint_nodes.dedup();
            endpoint_nodes.retain(|n| !n.is_empty());
            out.push(ServicePort {
                id: format!("{ns}/{name}:{port_name}"),
                protocol: protocol.to_string(),
                port: p.get("port").and_then(Value::as_i64).unwrap_or(0),
                node_port: p.get("nodePort").and_then(Value::as_i64).unwrap_or(0),
                cluster_ips: cluster_ips.clone(),
                external_ips: external_ips.clone(),
                lb_ips: lb_ips.clone(),
                endpoint_nodes,
                local_only,
                affinity,
                endpoints,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The load-balancer addresses this node answers for (as MetalLB's layer-2 mode): each
/// Service's addresses are announced by one node among those running its ready endpoints,
/// picked by a hash of the Service, so every agent reaches the same choice on its own.
fn announced_here(ports: &[ServicePort], node: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for sp in ports {
        if sp.lb_ips.is_empty() || sp.endpoint_nodes.is_empty() {
            continue;
        }
        let service = sp.id.split(':').next().unwrap_or(&sp.id);
        let h = Sha256::digest(service.as_bytes());
        let pick = u64::from_be_bytes(h[..8].try_into().expect("8 bytes")) as usize
            % sp.endpoint_nodes.len();
        if sp.endpoint_nodes[pick] == node {
            out.extend(sp.lb_ips.iter().cloned());
        }
    }
    out
}

/// The interface holding the node's address, and the load-balancer addresses the agent put on
/// it (labelled `<interface>:rklb`, so that a restarted agent finds its own).
fn lb_interface(node_ip: &str) -> Option<(String, BTreeSet<String>)> {
    let out = run_tool(&["ip", "-o", "-4", "addr", "show"], None).ok()?;
    let dev = out.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let i = words.iter().position(|w| *w == "inet")?;
        (words.get(i + 1)?.split('/').next()? == node_ip)
            .then(|| words.get(1).map(|d| d.to_string()))?
    })?;
    let label = format!("{dev}:rklb");
    let ours = out
        .lines()
        .filter(|l| l.contains(&format!(" {label}")))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "inet")?;
            words.get(i + 1)?.split('/').next().map(str::to_string)
        })
        .collect();
    Some((dev, ours))
}

/// A chain name from a prefix and a stable hash of what it stands for (at most 28 bytes).
fn chain(prefix: &str, what: &str) -> String {
    let digest = Sha256::digest(what.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02X}")).collect();
    format!("RKUBE-{prefix}-{hex}")
}

/// rkube's chains of one table, each with its rules (`-A CHAIN ...` lines).
type Chains = BTreeMap<String, Vec<String>>;

/// The whole rule set: the nat and filter tables' rkube chains.
#[derive(Debug, Default, Clone, PartialEq)]
struct Rules {
    nat: Chains,
    filter: Chains,
}

impl Rules {
    fn count(&self) -> usize {
        self.nat
            .values()
            .chain(self.filter.values())
            .map(Vec::len)
            .sum()
    }
}

/// The rules for the Services' ports.
fn render(ports: &[ServicePort]) -> Rules {
    let mut chains: BTreeSet<String> = [
        "RKUBE-SERVICES",
        "RKUBE-NODEPORTS",
        "RKUBE-POSTROUTING",
        "RKUBE-MARK-MASQ",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    let mut rules = Vec::new();
    let mut filter_rules = Vec::new();
    rules.push(format!(
        "-A RKUBE-POSTROUTING -m mark ! --mark {MASQ_MARK} -j RETURN"
    ));
    rules.push("-A RKUBE-POSTROUTING -j MARK --xor-mark 0x4000".to_string());
    rules.push("-A RKUBE-POSTROUTING -j MASQUERADE".to_string());
    rules.push("-A RKUBE-MARK-MASQ -j MARK --or-mark 0x4000".to_string());
    for sp in ports {
        let proto = sp.protocol.to_lowercase();
        let comment = format!("-m comment --comment \"{}\"", sp.id);
        let dest = |ip: &str, port: i64| format!("-d {ip}/32 -p {proto} -m {proto} --dport {port}");
        if sp.endpoints.is_empty() {
            // Nothing behind it: refuse at once rather than let connections hang.
            for ip in sp.cluster_ips.iter().chain(&sp.external_ips) {
                filter_rules.push(format!(
                    "-A RKUBE-SERVICES {comment} {} -j REJECT --reject-with icmp-port-unreachable",
                    dest(ip, sp.port)
                ));
            }
            if sp.node_port > 0 {
                filter_rules.push(format!(
                    "-A RKUBE-EXTERNAL-SERVICES {comment} -m addrtype --dst-type LOCAL -p {proto} -m {proto} --dport {} -j REJECT --reject-with icmp-port-unreachable",
                    sp.node_port
                ));
            }
            continue;
        }
        let svc = chain("SVC", &format!("{}/{}", sp.id, sp.protocol));
        chains.insert(svc.clone());
        let seps: Vec<(String, &(String, i64, bool))> = sp
            .endpoints
            .iter()
            .map(|ep| {
                (
                    chain(
                        "SEP",
                        &format!("{}/{}/{}:{}", sp.id, sp.protocol, ep.0, ep.1),
                    ),
                    ep,
                )
            })
            .collect();
        // Picks among `eps` at random (or the client's earlier pick), jumping to their chains.
        let spread = |rules: &mut Vec<String>,
                      from: &str,
                      eps: &[&(String, &(String, i64, bool))]| {
            if let Some(secs) = sp.affinity {
                for (sep, _) in eps {
                    rules.push(format!(
                        "-A {from} {comment} -m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}"
                    ));
                }
            }
            let n = eps.len();
            for (i, (sep, _)) in eps.iter().enumerate() {
                if i + 1 < n {
                    let p = 1.0 / (n - i) as f64;
                    rules.push(format!(
                        "-A {from} {comment} -m statistic --mode random --probability {p:.10} -j {sep}"
                    ));
                } else {
                    rules.push(format!("-A {from} {comment} -j {sep}"));
                }
            }
        };
        for ip in &sp.cluster_ips {
            rules.push(format!(
                "-A RKUBE-SERVICES {comment} {} -j {svc}",
                dest(ip, sp.port)
            ));
        }
        rules.push(format!("-A {svc} {comment} -j RKUBE-MARK-MASQ"));
        let all: Vec<&(String, &(String, i64, bool))> = seps.iter().collect();
        spread(&mut rules, &svc, &all);
        // NodePort and load-balancer traffic: every endpoint, or (Local) only this node's,
        // keeping the client's address.
        let external = if sp.local_only {
            let xlb = chain("XLB", &format!("{}/{}", sp.id, sp.protocol));
            chains.insert(xlb.clone());
            let local: Vec<&(String, &(String, i64, bool))> =
                seps.iter().filter(|(_, ep)| ep.2).collect();
            if local.is_empty() {
                rules.push(format!("-A {xlb} {comment} -j DROP"));
            } else {
                spread(&mut rules, &xlb, &local);
            }
            xlb
        } else {
            svc.clone()
        };
        for ip in &sp.external_ips {
            rules.push(format!(
                "-A RKUBE-SERVICES {comment} {} -j {external}",
                dest(ip, sp.port)
            ));
        }
        if sp.node_port > 0 {
            rules.push(format!(
                "-A RKUBE-NODEPORTS {comment} -p {proto} -m {proto} --dport {} -j {external}",
                sp.node_port
            ));
        }
        for (sep, ep) in &seps {
            chains.insert(sep.clone());
            if sp.affinity.is_some() {
                rules.push(format!(
                    "-A {sep} {comment} -p {proto} -m recent --name {sep} --set -m {proto} -j DNAT --to-destination {}:{}",
                    ep.0, ep.1
                ));
            } else {
                rules.push(format!(
                    "-A {sep} {comment} -p {proto} -m {proto} -j DNAT --to-destination {}:{}",
                    ep.0, ep.1
                ));
            }
        }
    }
    rules.push("-A RKUBE-SERVICES -m addrtype --dst-type LOCAL -j RKUBE-NODEPORTS".to_string());
    let group = |chains: BTreeSet<String>, rules: Vec<String>| -> Chains {
        let mut out: Chains = chains.into_iter().map(|c| (c, Vec::new())).collect();
        for r in rules {
            let chain = r.split(' ').nth(1).unwrap_or_default().to_string();
            out.entry(chain).or_default().push(r);
        }
        out
    };
    let filter_chains = ["RKUBE-SERVICES", "RKUBE-EXTERNAL-SERVICES"]
        .into_iter()
        .map(str::to_string)
        .collect();
    Rules {
        nat: group(chains, rules),
        filter: group(filter_chains, filter_rules),
    }
}

/// The `iptables-restore --noflush` input that takes the node from `prev` to `next`: only the
/// chains whose rules changed are rewritten (declaring a chain flushes it), chains no longer
/// wanted are flushed and deleted after the rewrites that stopped jumping to them. None when
/// nothing changed.
fn restore_input(prev: &Rules, next: &Rules) -> Option<String> {
    let mut out = String::new();
    for (table, p, n) in [
        ("nat", &prev.nat, &next.nat),
        ("filter", &prev.filter, &next.filter),
    ] {
        let changed: Vec<(&String, &Vec<String>)> =
            n.iter().filter(|(c, r)| p.get(*c) != Some(*r)).collect();
        let gone: Vec<&String> = p.keys().filter(|c| !n.contains_key(*c)).collect();
        if changed.is_empty() && gone.is_empty() {
            continue;
        }
        out.push_str(&format!("*{table}\n"));
        for c in changed.iter().map(|(c, _)| *c).chain(gone.iter().copied()) {
            out.push_str(&format!(":{c} - [0:0]\n"));
        }
        for r in changed.iter().flat_map(|(_, r)| r.iter()) {
            out.push_str(r);
            out.push('\n');
        }
        for c in &gone {
            out.push_str(&format!("-X {c}\n"));
        }
        out.push_str("COMMIT\n");
    }
    (!out.is_empty()).then_some(out)
}

/// The jumps from the built-in chains into rkube's, made once (checked first, so a restarted
/// agent adds none twice).
const JUMPS: [(&str, &str, &str); 6] = [
    ("nat", "PREROUTING", "-j RKUBE-SERVICES"),
    ("nat", "OUTPUT", "-j RKUBE-SERVICES"),
    ("nat", "POSTROUTING", "-j RKUBE-POSTROUTING"),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -j RKUBE-SERVICES",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -j RKUBE-SERVICES",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -j RKUBE-EXTERNAL-SERVICES",
    ),
];

/// Runs a tool (`ip`, `iptables`, `iptables-save`, `iptables-restore`) with `input` on its
/// standard input; its standard output, or an error with its standard error.
fn run_tool(args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let program = args[0];
    let mut child = std::process::Command::new(program)
        .args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("running {program}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// rkube's chains present in the node's tables (what an earlier run left), with contents
/// that match nothing rendered, so that the first sync rewrites or deletes every one.
fn existing_rules() -> Rules {
    let chains = |table: &str| -> Chains {
        run_tool(&["iptables-save", "-t", table], None)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| c.starts_with("RKUBE-"))
            .map(|c| (c.to_string(), vec!["(left by an earlier run)".to_string()]))
            .collect()
    };
    Rules {
        nat: chains("nat"),
        filter: chains("filter"),
    }
}

/// What the proxy programs (or, on a simulated node, would program), as the agent's metrics.
#[derive(Debug, Default, Clone)]
pub struct ProxyMetrics {
    pub syncs: prometheus_client::metrics::counter::Counter,
    pub rules: prometheus_client::metrics::gauge::Gauge,
    pub service_ports: prometheus_client::metrics::gauge::Gauge,
    pub endpoints: prometheus_client::metrics::gauge::Gauge,
    pub programmed: prometheus_client::metrics::gauge::Gauge,
    pub last_sync_milliseconds: prometheus_client::metrics::gauge::Gauge,
}

impl ProxyMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "rkube_proxy_syncs",
            "Rule syncs that changed the rule set",
            self.syncs.clone(),
        );
        r.register(
            "rkube_proxy_rules",
            "Rules in the node's rule set (rkube chains, nat and filter)",
            self.rules.clone(),
        );
        r.register(
            "rkube_proxy_service_ports",
            "Service ports with a virtual address",
            self.service_ports.clone(),
        );
        r.register(
            "rkube_proxy_endpoints",
            "Ready endpoints behind them",
            self.endpoints.clone(),
        );
        r.register("rkube_proxy_programmed", "1 when the rules are programmed into the node, 0 when only worked out (simulated nodes)", self.programmed.clone());
        r.register(
            "rkube_proxy_last_sync_milliseconds",
            "How long the last sync took",
            self.last_sync_milliseconds.clone(),
        );
    }
}

/// Follows Services and EndpointSlices and programs the node until the process ends. With
/// `program` false (the simulated runtime: no pods, no rules) it only renders and logs what it
/// would program.
pub async fn run(
    clients: Arc<Clients>,
    node: String,
    node_ip: String,
    program: bool,
    metrics: ProxyMetrics,
) {
    metrics.programmed.set(i64::from(program));
    let services: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let slices: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let changed = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(mirror::<Service>(
        clients.clone(),
        services.clone(),
        changed.clone(),
    ));
    tokio::spawn(mirror::<EndpointSlice>(
        clients.clone(),
        slices.clone(),
        changed.clone(),
    ));
    if program {
        for (table, builtin, rule) in JUMPS {
            let target = rule.rsplit(' ').next().unwrap_or_default();
            // The chain must exist before a jump to it.
            let _ = run_tool(&["iptables", "-t", table, "-N", target], None);
            let words: Vec<&str> = rule.split(' ').collect();
            let check: Vec<&str> = ["iptables", "-t", table, "-C", builtin]
                .into_iter()
                .chain(words.iter().copied())
                .collect();
            if run_tool(&check, None).is_err() {
                let insert: Vec<&str> = ["iptables", "-t", table, "-I", builtin, "1"]
                    .into_iter()
                    .chain(words.iter().copied())
                    .collect();
                if let Err(e) = run_tool(&insert, None) {
                    tracing::warn!(error = %e, "the service proxy cannot program this node");
                    return;
                }
            }
        }
    }
    let mut present = if program {
        existing_rules()
    } else {
        Rules::default()
    };
    let mut lb = if program {
        lb_interface(&node_ip)
    } else {
        None
    };
    loop {
        changed.notified().await;
        // Changes that come together are programmed together.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let ports = {
            let services = services.lock().unwrap_or_else(|e| e.into_inner());
            let slices = slices.lock().unwrap_or_else(|e| e.into_inner());
            service_ports(&services, &slices, &node)
        };
        if let Some((dev, ours)) = lb.as_mut() {
            let wanted = announced_here(&ports, &node);
            for ip in wanted.difference(ours).cloned().collect::<Vec<_>>() {
                let cidr = format!("{ip}/32");
                let label = format!("{dev}:rklb");
                match run_tool(
                    &["ip", "addr", "add", &cidr, "dev", dev, "label", &label],
                    None,
                ) {
                    Ok(_) => {
                        tracing::info!(address = %ip, "answering for a load-balancer address");
                        ours.insert(ip);
                    }
                    Err(e) => tracing::warn!(error = %e, "taking a load-balancer address failed"),
                }
            }
            for ip in ours.difference(&wanted).cloned().collect::<Vec<_>>() {
                let cidr = format!("{ip}/32");
                if run_tool(&["ip", "addr", "del", &cidr, "dev", dev], None).is_ok() {
                    ours.remove(&ip);
                }
            }
        }
        let begun = Instant::now();
        let rules = render(&ports);
        let Some(input) = restore_input(&present, &rules) else {
            continue;
        };
        if program {
            if let Err(e) = run_tool(&["iptables-restore", "--noflush"], Some(&input)) {
                tracing::warn!(error = %e, "programming the node's service rules failed; retrying");
                let changed = changed.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    changed.notify_one();
                });
                continue;
            }
        }
        let took = begun.elapsed();
        metrics.syncs.inc();
        metrics.rules.set(rules.count() as i64);
        metrics.service_ports.set(ports.len() as i64);
        metrics
            .endpoints
            .set(ports.iter().map(|p| p.endpoints.len() as i64).sum());
        metrics.last_sync_milliseconds.set(took.as_millis() as i64);
        tracing::info!(
            services = ports.len(),
            rules = rules.count(),
            written = input.lines().filter(|l| l.starts_with("-A")).count(),
            took_ms = took.as_millis() as u64,
            programmed = program,
            "service rules synced"
        );
        present = rules;
    }
}

/// Keeps `into` equal to the API's objects of kind `K` (all namespaces), by `namespace/name`;
/// `changed` is notified on every change.
async fn mirror<K>(
    clients: Arc<Clients>,
    into: Arc<Mutex<HashMap<String, Value>>>,
    changed: Arc<tokio::sync::Notify>,
) where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let key = |v: &Value| format!("{}/{}", s(v, "/metadata/namespace"), s(v, "/metadata/name"));
    loop {
        let api: Api<K> = Api::all(clients.get());
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "listing for the service proxy failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut m = into.lock().unwrap_or_else(|e| e.into_inner());
            m.clear();
            for o in list.items {
                let v = serde_json::to_value(&o).unwrap_or_default();
                m.insert(key(&v), v);
            }
        }
        changed.notify_one();
        'watch: loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &rv).await {
                Ok(s) => s,
                Err(_) => break,
            };
            let mut stream = Box::pin(stream);
            while let Some(ev) = stream.next().await {
                let (v, gone) = match ev {
                    Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => {
                        (serde_json::to_value(&o), false)
                    }
                    Ok(WatchEvent::Deleted(o)) => (serde_json::to_value(&o), true),
                    Ok(WatchEvent::Bookmark(b)) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(_)) | Err(_) => break 'watch,
                };
                let Ok(v) = v else { continue };
                rv = s(&v, "/metadata/resourceVersion").to_string();
                let mut m = into.lock().unwrap_or_else(|e| e.into_inner());
                if gone {
                    m.remove(&key(&v));
                } else {
                    m.insert(key(&v), v);
                }
                drop(m);
                changed.notify_one();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn objects() -> (HashMap<String, Value>, HashMap<String, Value>) {
        let svc = json!({"metadata": {"namespace": "default", "name": "web"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30008, "protocol": "TCP"}]}});
        let empty = json!({"metadata": {"namespace": "default", "name": "nobody"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.30",
                     "ports": [{"port": 81, "protocol": "TCP"}]}});
        let headless = json!({"metadata": {"namespace": "default", "name": "db"},
            "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}});
        let slice = json!({"metadata": {"namespace": "default", "name": "web-abc",
                "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true}, "nodeName": "a"},
                {"addresses": ["10.244.2.7"], "conditions": {"ready": true}, "nodeName": "b"},
                {"addresses": ["10.244.2.9"], "conditions": {"ready": false}, "nodeName": "b"}]});
        let services = [
            ("default/web", svc),
            ("default/nobody", empty),
            ("default/db", headless),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let slices = [("default/web-abc".to_string(), slice)]
            .into_iter()
            .collect();
        (services, slices)
    }

    #[test]
    fn ready_endpoints_behind_each_service_port() {
        let (services, slices) = objects();
        let ports = service_ports(&services, &slices, "a");
        assert_eq!(
            ports.len(),
            2,
            "the headless Service has no virtual address"
        );
        let web = ports.iter().find(|p| p.id == "default/web:http").unwrap();
        assert_eq!(
            web.endpoints,
            vec![
                ("10.244.1.5".into(), 8080, true),
                ("10.244.2.7".into(), 8080, false)
            ]
        );
        assert_eq!(web.node_port, 30008);
        let nobody = ports.iter().find(|p| p.id == "default/nobody:").unwrap();
        assert!(nobody.endpoints.is_empty());
    }

    #[test]
    fn rules_spread_over_endpoints_and_reject_without_any() {
        let (services, slices) = objects();
        let ports = service_ports(&services, &slices, "a");
        let left = Rules {
            nat: [(
                "RKUBE-SVC-0000000000000000".to_string(),
                vec!["old".to_string()],
            )]
            .into(),
            filter: Chains::new(),
        };
        let next = render(&ports);
        let rules = restore_input(&left, &next).unwrap();
        let svc = chain("SVC", "default/web:http/TCP");
        assert!(rules.contains(&format!(
            "-A RKUBE-SERVICES -m comment --comment \"default/web:http\" -d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j {svc}"
        )), "{rules}");
        assert!(
            rules.contains("-m statistic --mode random --probability 0.5000000000"),
            "{rules}"
        );
        assert!(rules.contains("-j DNAT --to-destination 10.244.1.5:8080"));
        assert!(rules.contains("-j DNAT --to-destination 10.244.2.7:8080"));
        assert!(!rules.contains("10.244.2.9"), "not ready: no traffic");
        assert!(rules.contains("--dport 30008 -j RKUBE-SVC-"));
        assert!(
            rules.contains("-d 10.96.0.30/32 -p tcp -m tcp --dport 81 -j REJECT"),
            "{rules}"
        );
        assert!(
            rules.contains("-X RKUBE-SVC-0000000000000000"),
            "stale chains go"
        );
        assert!(next.nat.contains_key(&svc));
        // The same objects give the same rules: nothing to write on a resync.
        assert_eq!(restore_input(&next, &render(&ports)), None);
    }

    #[test]
    fn an_endpoint_change_rewrites_only_its_service_s_chains() {
        let (services, mut slices) = objects();
        let before = render(&service_ports(&services, &slices, "a"));
        slices.get_mut("default/web-abc").unwrap()["endpoints"][0]["addresses"][0] =
            json!("10.244.1.6");
        let after = render(&service_ports(&services, &slices, "a"));
        let input = restore_input(&before, &after).unwrap();
        let declared: Vec<&str> = input.lines().filter(|l| l.starts_with(':')).collect();
        // The Service's chain, the new endpoint's chain, the old endpoint's chain (deleted).
        assert_eq!(declared.len(), 3, "{input}");
        assert!(
            !input.contains("RKUBE-SERVICES"),
            "the Service's address did not change"
        );
        assert!(input.contains("--to-destination 10.244.1.6:8080"));
        assert_eq!(input.lines().filter(|l| l.starts_with("-X ")).count(), 1);
    }

    #[test]
    fn one_node_with_endpoints_answers_for_a_load_balancer_address() {
        let (mut services, slices) = objects();
        services.get_mut("default/web").unwrap()["status"] =
            json!({"loadBalancer": {"ingress": [{"ip": "10.200.0.200"}]}});
        let answering: Vec<&str> = ["a", "b", "c"]
            .into_iter()
            .filter(|n| !announced_here(&service_ports(&services, &slices, n), n).is_empty())
            .collect();
        assert_eq!(answering.len(), 1, "{answering:?}");
        assert_ne!(answering[0], "c", "c runs none of its endpoints");
        let rules = render(&service_ports(&services, &slices, "a"));
        assert!(rules.nat["RKUBE-SERVICES"]
            .iter()
            .any(|r| r.contains("-d 10.200.0.200/32 -p tcp -m tcp --dport 80 -j RKUBE-SVC-")));
    }

    #[test]
    fn local_traffic_policy_keeps_node_ports_to_this_node() {
        let (mut services, slices) = objects();
        services.get_mut("default/web").unwrap()["spec"]["externalTrafficPolicy"] = json!("Local");
        let full = |node: &str| {
            restore_input(
                &Rules::default(),
                &render(&service_ports(&services, &slices, node)),
            )
            .unwrap()
        };
        let on_b = full("b");
        let xlb = chain("XLB", "default/web:http/TCP");
        assert!(on_b.contains(&format!("--dport 30008 -j {xlb}")));
        let xlb_rules: Vec<&str> = on_b
            .lines()
            .filter(|l| l.starts_with(&format!("-A {xlb}")))
            .collect();
        assert_eq!(xlb_rules.len(), 1, "one local endpoint on b: {xlb_rules:?}");
        let on_c = full("c");
        assert!(on_c.contains(&format!(
            "-A {xlb} -m comment --comment \"default/web:http\" -j DROP"
        )));
    }
}
