//! Addresses for LoadBalancer Services from a pool (`--load-balancer-ip-range`), as a bare-metal
//! load-balancer implementation (MetalLB's layer-2 mode) gives them: each LoadBalancer Service
//! without a `loadBalancerClass` gets one free address of the pool in
//! `status.loadBalancer.ingress` (its `spec.loadBalancerIP` when that is in the pool and free);
//! a Service that stops being a LoadBalancer gives its address back. The node agents answer for
//! the addresses (see the agent's proxy). Without a pool, LoadBalancer Services stay
//! `<pending>`, as on any cluster without a load-balancer implementation.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service};
use rkube_api::client::LocalClient;
use rkube_core::meta::{name, namespace};
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::store::Store;

/// A range of IPv4 addresses: `A-B` or a CIDR (its usable addresses).
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    first: u32,
    last: u32,
}

impl std::str::FromStr for Pool {
    type Err = String;

    fn from_str(s: &str) -> Result<Pool, String> {
        let ip = |x: &str| {
            x.trim()
                .parse::<Ipv4Addr>()
                .map(u32::from)
                .map_err(|e| format!("{x:?}: {e}"))
        };
        let (first, last) = if let Some((a, b)) = s.split_once('-') {
            (ip(a)?, ip(b)?)
        } else if let Some((a, len)) = s.split_once('/') {
            let len: u32 = len
                .parse()
                .ok()
                .filter(|l| (8..=30).contains(l))
                .ok_or_else(|| format!("{s:?}: the prefix length must be 8 to 30"))?;
            let base = ip(a)? & (u32::MAX << (32 - len));
            (base + 1, (base | !(u32::MAX << (32 - len))) - 1)
        } else {
            return Err(format!(
                "{s:?} is not a range (A-B, like 10.0.0.200-10.0.0.250, or a CIDR)"
            ));
        };
        if first > last {
            return Err(format!("{s:?}: the range is empty"));
        }
        Ok(Pool { first, last })
    }
}

impl Pool {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        (self.first..=self.last).contains(&u32::from(ip))
    }

    fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> {
        (self.first..=self.last).map(Ipv4Addr::from)
    }
}

fn ingress_ips(svc: &Service) -> Vec<Ipv4Addr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|a| {
            a.iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The Service's `spec.loadBalancerClass`, "" when it has none.
fn class(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.load_balancer_class.as_deref())
        .unwrap_or("")
}

/// The status each Service should have, for the ones whose status must change: (namespace,
/// name, new `status.loadBalancer`).
fn plan(services: &[Arc<Service>], pool: &Pool) -> Vec<(String, String, LoadBalancerStatus)> {
    let wants = |svc: &Service| {
        svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
            && class(svc).is_empty()
    };
    // Addresses kept: those of LoadBalancer Services that hold pool addresses already.
    let mut taken: BTreeSet<Ipv4Addr> = services
        .iter()
        .filter(|svc| wants(svc))
        .flat_map(|svc| ingress_ips(svc))
        .filter(|ip| pool.contains(*ip))
        .collect();
    let mut out = Vec::new();
    for svc in services {
        let (ns, name) = (namespace(&svc.metadata), name(&svc.metadata));
        let held = ingress_ips(svc);
        if !wants(svc) {
            // No longer a LoadBalancer: its pool address goes back.
            if class(svc).is_empty() && held.iter().any(|ip| pool.contains(*ip)) {
                out.push((ns.into(), name.into(), LoadBalancerStatus::default()));
            }
            continue;
        }
        if held.iter().any(|ip| pool.contains(*ip)) {
            continue;
        }
        let asked: Option<Ipv4Addr> = svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_ip.as_deref()?.parse().ok());
        let pick = match asked {
            Some(ip) if pool.contains(ip) && !taken.contains(&ip) => Some(ip),
            Some(_) => None,
            None => pool.addresses().find(|ip| !taken.contains(ip)),
        };
        if let Some(ip) = pick {
            taken.insert(ip);
            let ingress = LoadBalancerIngress {
                ip: Some(ip.to_string()),
                ip_mode: Some("VIP".into()),
                ..Default::default()
            };
            out.push((
                ns.into(),
                name.into(),
                LoadBalancerStatus {
                    ingress: Some(vec![ingress]),
                },
            ));
        }
    }
    out
}

/// The merge patch that gives a Service `status` as its `status.loadBalancer`: the ingress
/// list is named even when there is none (`null` removes it; an empty object would merge into
/// the old one and keep the address).
fn status_patch(status: &LoadBalancerStatus) -> Value {
    json!({"status": {"loadBalancer": {"ingress": status.ingress}}})
}

pub fn run(
    services: Arc<Store<Service>>,
    client: LocalClient,
    pool: Pool,
    mut stop: watch::Receiver<bool>,
) {
    let wake = Arc::new(Notify::new());
    let w = wake.clone();
    services.on_change(Box::new(move |_, _| w.notify_one()));
    tokio::spawn(async move {
        services.wait_synced().await;
        loop {
            for (ns, name, status) in plan(&services.list(""), &pool) {
                let patch = status_patch(&status);
                let written = Objects::<Service>::namespaced(&client, &ns)
                    .merge_patch_status(&name, &patch)
                    .await;
                match ignore_gone(written) {
                    Ok(_) => {
                        tracing::info!(service = %format!("{ns}/{name}"), status = %patch["status"]["loadBalancer"], "load-balancer address")
                    }
                    Err(e) => tracing::debug!(error = %e, "writing a load-balancer address failed"),
                }
            }
            tokio::select! {
                _ = wake.notified() => {}
                // A Service that could not get an address (the pool was full) tries again.
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, ty: &str, ip: Option<&str>, asked: Option<&str>) -> Arc<Service> {
        let mut v = json!({"metadata": {"namespace": "default", "name": name},
                           "spec": {"type": ty}});
        if let Some(ip) = ip {
            v["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
        }
        if let Some(a) = asked {
            v["spec"]["loadBalancerIP"] = json!(a);
        }
        Arc::new(serde_json::from_value(v).expect("a Service"))
    }

    fn given(ip: &str) -> LoadBalancerStatus {
        serde_json::from_value(json!({"ingress": [{"ip": ip, "ipMode": "VIP"}]})).expect("status")
    }

    #[test]
    fn a_given_back_address_leaves_the_status() {
        let mut held =
            serde_json::to_value(svc("e", "NodePort", Some("10.0.0.201"), None)).unwrap();
        rkube_api::patch::merge_patch(&mut held, &status_patch(&LoadBalancerStatus::default()));
        assert_eq!(held["status"], json!({"loadBalancer": {}}));
        let mut pending = serde_json::to_value(svc("b", "LoadBalancer", None, None)).unwrap();
        rkube_api::patch::merge_patch(&mut pending, &status_patch(&given("10.0.0.201")));
        assert_eq!(
            pending["status"]["loadBalancer"],
            json!({"ingress": [{"ip": "10.0.0.201", "ipMode": "VIP"}]})
        );
    }

    #[test]
    fn pools_from_ranges_and_cidrs() {
        let p: Pool = "10.0.0.200-10.0.0.202".parse().unwrap();
        assert_eq!(p.addresses().count(), 3);
        let p: Pool = "192.168.10.0/30".parse().unwrap();
        let all: Vec<String> = p.addresses().map(|a| a.to_string()).collect();
        assert_eq!(all, vec!["192.168.10.1", "192.168.10.2"]);
        assert!("10.0.0.5-10.0.0.1".parse::<Pool>().is_err());
        assert!("nonsense".parse::<Pool>().is_err());
    }

    #[test]
    fn free_addresses_go_to_services_that_want_one() {
        let pool: Pool = "10.0.0.200-10.0.0.201".parse().unwrap();
        let services = vec![
            svc("a", "LoadBalancer", Some("10.0.0.200"), None),
            svc("b", "LoadBalancer", None, None),
            svc("c", "LoadBalancer", None, None),
            svc("d", "ClusterIP", Some("10.0.0.199"), None),
            svc("e", "NodePort", Some("10.0.0.201"), None),
        ];
        let p = plan(&services, &pool);
        // b takes the free address, c waits (the pool is spent), e gives its address back.
        assert_eq!(
            p,
            vec![
                ("default".into(), "b".into(), given("10.0.0.201")),
                ("default".into(), "e".into(), LoadBalancerStatus::default()),
            ]
        );
        let services = vec![
            svc("a", "LoadBalancer", Some("10.0.0.200"), None),
            svc("b", "LoadBalancer", None, None),
            svc("c", "LoadBalancer", None, Some("10.0.0.200")),
        ];
        let p = plan(&services, &pool);
        assert_eq!(
            p,
            vec![("default".into(), "b".into(), given("10.0.0.201"))],
            "c asked for a taken address: it stays pending"
        );
    }
}
