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
//!
//! `mirror.rs` keeps the API's Services and EndpointSlices in memory; `service_ports.rs` reads
//! them into the ports to program; `rules.rs` renders the rule set and the restore input that
//! changes the node's; `iptables.rs` runs the tools and holds the jumps from the built-in
//! chains; `load_balancer.rs` picks the load-balancer addresses this node answers for;
//! `metrics.rs` counts what was programmed. This file holds the loop that ties them together.

mod iptables;
mod load_balancer;
mod metrics;
mod mirror;
mod rules;
mod service_ports;
#[cfg(test)]
mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::join::Clients;
use iptables::{existing_rules, run_tool, JUMPS};
use load_balancer::{announced_here, lb_interface};
use mirror::mirror;
use rules::{render, restore_input, Rules};
use service_ports::service_ports;

pub use metrics::ProxyMetrics;

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
    let services: Arc<Mutex<HashMap<String, Service>>> = Arc::default();
    let slices: Arc<Mutex<HashMap<String, EndpointSlice>>> = Arc::default();
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
