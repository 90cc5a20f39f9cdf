//! Service addresses: a ClusterIP from the service range and NodePorts from the node port
//! range, each held by a claim key in the store (`/registry/ipaddresses/<ip>`,
//! `/registry/servicenodeports/<port>`) written in the same transaction as the Service, so two
//! Services can never hold the same address, even when created at the same moment on
//! different members.

use std::net::Ipv4Addr;

use rand::Rng;
use serde_json::{json, Value};

use crate::error::{ApiError, Cause};

pub const IP_CLAIMS: &str = "/registry/ipaddresses/";
pub const PORT_CLAIMS: &str = "/registry/servicenodeports/";
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// The service IP range (`--service-cluster-ip-range`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceNet {
    base: u32,
    prefix: u8,
}

impl std::str::FromStr for ServiceNet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR (like 10.96.0.0/12)"))?;
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("{s:?}: {ip:?} is not an IPv4 address"))?;
        let prefix: u8 = len
            .parse()
            .ok()
            .filter(|p| (8..=30).contains(p))
            .ok_or_else(|| format!("{s:?}: the prefix length must be between 8 and 30"))?;
        let mask = u32::MAX << (32 - prefix);
        Ok(ServiceNet {
            base: u32::from(ip) & mask,
            prefix,
        })
    }
}

impl Default for ServiceNet {
    fn default() -> Self {
        "10.96.0.0/12".parse().expect("a valid default range")
    }
}

impl std::fmt::Display for ServiceNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

impl ServiceNet {
    fn size(&self) -> u32 {
        1u32 << (32 - self.prefix)
    }

    /// The first usable address: the `kubernetes` Service's.
    pub fn first(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1)
    }

    /// The names and address by which pods reach the API through the `kubernetes` Service,
    /// which the API's certificate must carry (kubeadm's): its ClusterIP and
    /// `kubernetes.default.svc.<domain>` with its shorter forms.
    pub fn api_sans(&self, domain: &str) -> Vec<String> {
        vec![
            self.first().to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            format!("kubernetes.default.svc.{domain}"),
        ]
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let v = u32::from(ip);
        v > self.base && v < self.base + self.size() - 1
    }

    /// The tenth address: the cluster DNS Service's (`kube-dns`), as kubeadm sets it.
    pub fn dns(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 10)
    }

    /// A random usable address other than the first and the tenth (kept for `kubernetes` and
    /// `kube-dns`).
    fn random(&self) -> Ipv4Addr {
        loop {
            let n = rand::thread_rng().gen_range(2..self.size() - 1);
            if n != 10 {
                return Ipv4Addr::from(self.base + n);
            }
        }
    }
}

fn invalid(field: &str, message: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.into(),
        message,
    }
}

fn needs_ip(svc: &Value) -> bool {
    svc.pointer("/spec/type").and_then(Value::as_str) != Some("ExternalName")
        && svc.pointer("/spec/clusterIP").and_then(Value::as_str) != Some("None")
}

fn needs_node_ports(svc: &Value) -> bool {
    matches!(
        svc.pointer("/spec/type").and_then(Value::as_str),
        Some("NodePort" | "LoadBalancer")
    )
}

/// The claim keys a Service holds.
pub fn claims(svc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(ip) = svc.pointer("/spec/clusterIP").and_then(Value::as_str) {
        if ip.parse::<Ipv4Addr>().is_ok() {
            out.push(format!("{IP_CLAIMS}{ip}"));
        }
    }
    for p in svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(np) = p.get("nodePort").and_then(Value::as_i64) {
            out.push(format!("{PORT_CLAIMS}{np}"));
        }
    }
    out
}

/// The claims the client asked for by value (as opposed to ones the server picked): a
/// collision on these is the client's error, not a reason to pick again.
pub fn requested(svc: &Value) -> Vec<String> {
    claims(svc)
}

/// Carries addresses over from the stored Service to an update that left them out (a PUT of a
/// manifest without clusterIP keeps the address, as in Kubernetes).
pub fn keep_allocated(current: &Value, new: &mut Value) {
    if new.pointer("/spec/clusterIP").is_none() {
        if let Some(ip) = current.pointer("/spec/clusterIP").cloned() {
            if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                spec.insert("clusterIP".into(), ip);
                if let Some(ips) = current.pointer("/spec/clusterIPs").cloned() {
                    spec.insert("clusterIPs".into(), ips);
                }
            }
        }
    }
    if !needs_node_ports(new) {
        return;
    }
    let old_ports: Vec<Value> = current
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for p in new
        .pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let Some(p) = p.as_object_mut() else { continue };
        if p.get("nodePort").is_some() {
            continue;
        }
        let same = old_ports
            .iter()
            .find(|o| o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol"));
        if let Some(np) = same.and_then(|o| o.get("nodePort")).cloned() {
            p.insert("nodePort".into(), np);
        }
    }
}

/// Fills in the addresses a Service still needs (random free-looking ones: the transaction
/// that stores it decides) and checks requested ones are in range.
pub fn allocate(net: &ServiceNet, svc: &mut Value) -> Result<(), ApiError> {
    let name = svc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut causes = Vec::new();
    if !svc.get("spec").is_some_and(Value::is_object) {
        return Err(ApiError::invalid(
            "",
            "Service",
            &name,
            vec![invalid("spec", "Invalid value: must be an object".into())],
        ));
    }
    if needs_ip(svc) {
        match svc.pointer("/spec/clusterIP").and_then(Value::as_str) {
            None | Some("") => {
                let ip = net.random().to_string();
                crate::value::set(svc, &["spec", "clusterIP"], json!(ip));
                crate::value::set(svc, &["spec", "clusterIPs"], json!([ip]));
            }
            Some(ip) => match ip.parse::<Ipv4Addr>() {
                Ok(addr) if net.contains(addr) => {
                    crate::value::set(svc, &["spec", "clusterIPs"], json!([ip]));
                }
                Ok(_) => causes.push(invalid(
                    "spec.clusterIPs",
                    format!("Invalid value: []string{{\"{ip}\"}}: failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {net}"),
                )),
                Err(_) => causes.push(invalid(
                    "spec.clusterIPs[0]",
                    format!("Invalid value: \"{ip}\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"),
                )),
            },
        }
    } else if svc.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None") {
        crate::value::set(svc, &["spec", "clusterIPs"], json!(["None"]));
    }
    if needs_node_ports(svc) {
        let ports = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut);
        for (i, p) in ports.into_iter().flatten().enumerate() {
            let Some(p) = p.as_object_mut() else {
                causes.push(invalid(
                    &format!("spec.ports[{i}]"),
                    "Invalid value: must be an object".into(),
                ));
                continue;
            };
            match p.get("nodePort").and_then(Value::as_i64) {
                None => {
                    let port = rand::thread_rng().gen_range(NODE_PORTS);
                    p.insert("nodePort".into(), json!(port));
                }
                Some(n) if n >= *NODE_PORTS.start() as i64 && n <= *NODE_PORTS.end() as i64 => {}
                Some(n) => causes.push(invalid(
                    &format!("spec.ports[{i}].nodePort"),
                    format!("Invalid value: {n}: provided port is not in the valid range. The range of valid ports is {}-{}", NODE_PORTS.start(), NODE_PORTS.end()),
                )),
            }
        }
    } else if let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.shift_remove("nodePort");
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("", "Service", &name, causes))
    }
}

/// The 422 for a requested address another Service holds.
pub fn taken(svc: &Value, claim: &str) -> ApiError {
    let name = svc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let cause = if let Some(ip) = claim.strip_prefix(IP_CLAIMS) {
        invalid(
            "spec.clusterIPs",
            format!("Invalid value: []string{{\"{ip}\"}}: failed to allocate IP {ip}: provided IP is already allocated"),
        )
    } else {
        let port = claim.strip_prefix(PORT_CLAIMS).unwrap_or(claim);
        let idx = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .and_then(|ps| {
                ps.iter().position(|p| {
                    p.get("nodePort").map(|v| v.to_string()) == Some(port.to_string())
                })
            })
            .unwrap_or(0);
        invalid(
            &format!("spec.ports[{idx}].nodePort"),
            format!("Invalid value: {port}: provided port is already allocated"),
        )
    };
    ApiError::invalid("", "Service", name, vec![cause])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_range_and_first_address() {
        let net = ServiceNet::default();
        assert_eq!(net.to_string(), "10.96.0.0/12");
        assert_eq!(net.first(), Ipv4Addr::new(10, 96, 0, 1));
        assert!(net.contains(Ipv4Addr::new(10, 111, 255, 254)));
        assert!(!net.contains(Ipv4Addr::new(10, 112, 0, 1)));
        assert!("10.0.0.0".parse::<ServiceNet>().is_err());
    }

    #[test]
    fn allocation_fills_what_is_missing_and_checks_ranges() {
        let net = ServiceNet::default();
        let mut svc = json!({"metadata": {"name": "web"}, "spec": {"type": "NodePort",
            "ports": [{"port": 80}, {"port": 443, "nodePort": 30443}]}});
        allocate(&net, &mut svc).unwrap();
        let ip: Ipv4Addr = svc["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(net.contains(ip) && ip != net.first());
        assert!(
            NODE_PORTS.contains(&(svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap() as u16))
        );
        assert_eq!(svc["spec"]["ports"][1]["nodePort"], 30443);
        assert_eq!(claims(&svc).len(), 3);

        let mut bad = json!({"metadata": {"name": "x"}, "spec": {"type": "NodePort", "clusterIP": "192.168.0.1",
            "ports": [{"port": 80, "nodePort": 80}]}});
        let e = allocate(&net, &mut bad).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.causes.len(), 2);

        let mut headless =
            json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": []}});
        allocate(&net, &mut headless).unwrap();
        assert!(claims(&headless).is_empty());
    }
}
