//! The rule set, rkube's nat and filter chains rendered from the Services' ports, and the
//! `iptables-restore` input that takes the node from one rule set to the next.

use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use super::service_ports::ServicePort;

/// The mark that asks POSTROUTING to masquerade, as kube-proxy's.
const MASQ_MARK: &str = "0x4000/0x4000";

/// A chain name from a prefix and a stable hash of what it stands for (at most 28 bytes).
fn chain(prefix: &str, what: &str) -> String {
    let digest = Sha256::digest(what.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02X}")).collect();
    format!("RKUBE-{prefix}-{hex}")
}

/// rkube's chains of one table, each with its rules (`-A CHAIN ...` lines).
pub(super) type Chains = BTreeMap<String, Vec<String>>;

/// The whole rule set: the nat and filter tables' rkube chains.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Rules {
    pub(super) nat: Chains,
    pub(super) filter: Chains,
}

impl Rules {
    pub(super) fn count(&self) -> usize {
        self.nat
            .values()
            .chain(self.filter.values())
            .map(Vec::len)
            .sum()
    }
}

/// The rules for the Services' ports.
pub(super) fn render(ports: &[ServicePort]) -> Rules {
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
pub(super) fn restore_input(prev: &Rules, next: &Rules) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::service_ports::service_ports;
    use crate::proxy::testing::objects;

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
        slices.get_mut("default/web-abc").unwrap().endpoints[0].addresses[0] = "10.244.1.6".into();
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
    fn local_traffic_policy_keeps_node_ports_to_this_node() {
        let (mut services, slices) = objects();
        let web = services.get_mut("default/web").unwrap();
        web.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
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
