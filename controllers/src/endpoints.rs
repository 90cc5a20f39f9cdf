//! Endpoints and EndpointSlices for Services with a selector: the addresses of the matching
//! pods that have an IP and have not ended, ready ones under `addresses` and the others under
//! `notReadyAddresses` (in a slice: `conditions.ready`), with each Service port's targetPort
//! resolved against the pod (a named port by the container port of that name). A terminating
//! pod is left out of Endpoints and kept in its slice as not ready, serving while it is
//! ready. `spec.publishNotReadyAddresses` makes every such address ready, terminating ones
//! included. Services without a selector keep whatever Endpoints their users write.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
    ServicePort,
};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointPort as SlicePort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_ref, key, name, namespace};

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::store::Store;

const WORKERS: usize = 2;
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";
const HEADLESS: &str = "service.kubernetes.io/headless";

/// A Service port resolved for one pod: (name, port number on the pod, protocol).
type PodPort = (String, i32, String);

/// The port a Service port reaches on `pod`, or None when a named targetPort has no container
/// port of that name.
fn resolve(port: &ServicePort, pod: &Pod) -> Option<PodPort> {
    let name = port.name.clone().unwrap_or_default();
    let protocol = match port.protocol.as_deref() {
        None | Some("") => "TCP".to_string(),
        Some(p) => p.to_string(),
    };
    let number = match &port.target_port {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(named)) => {
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(named.as_str()))?
                .container_port
        }
        None => port.port,
    };
    Some((name, number, protocol))
}

/// Whether the pod has condition Ready=True.
fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Where a pod's address goes: in Endpoints (None: left out; Some(ready): under `addresses`
/// or `notReadyAddresses`), and its slice endpoint's `ready` condition. Endpoints leave a
/// terminating pod out unless not-ready addresses are published; a slice keeps it, not ready.
fn readiness(publish_not_ready: bool, serving: bool, deleting: bool) -> (Option<bool>, bool) {
    let in_endpoints = (!deleting || publish_not_ready).then_some(publish_not_ready || serving);
    (in_endpoints, publish_not_ready || (serving && !deleting))
}

fn pod_ip(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .unwrap_or("")
}

/// The selector of a Service that has one (a non-empty label map).
fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

/// Whether a Service's selector (a plain label map) selects the pod.
fn selects(svc: &Service, pod: &Pod) -> bool {
    let Some(sel) = selector(svc) else {
        return false;
    };
    if namespace(&svc.metadata) != namespace(&pod.metadata) {
        return false;
    }
    let labels = pod.metadata.labels.as_ref();
    sel.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// The hostname an endpoint of the pod has: the pod's own, when its subdomain names the
/// Service (Kubernetes' `ShouldSetHostname`; what gives a StatefulSet's pods their DNS names
/// through the governing Service).
fn hostname<'a>(svc: &Service, pod: &'a Pod) -> Option<&'a str> {
    let spec = pod.spec.as_ref()?;
    let hostname = spec.hostname.as_deref().unwrap_or("");
    let named = spec.subdomain.as_deref().unwrap_or("") == name(&svc.metadata)
        && namespace(&pod.metadata) == namespace(&svc.metadata);
    (!hostname.is_empty() && named).then_some(hostname)
}

/// What a Service's Endpoints and EndpointSlice should hold.
#[derive(Debug, Default)]
struct Desired {
    /// Pods grouped by the ports they resolve to (Kubernetes' subsets).
    subsets: Vec<EndpointSubset>,
    slice_endpoints: Vec<Endpoint>,
    /// The ports of the slice: those the first pod resolves.
    slice_ports: Vec<PodPort>,
}

/// The endpoints of `svc` for the pods it selects, in the order of their IPs.
fn desired(svc: &Service, mut pods: Vec<Arc<Pod>>) -> Desired {
    let ns = namespace(&svc.metadata);
    let ports: &[ServicePort] = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    // Clients that must find pods before they are ready (a StatefulSet's peers by their DNS
    // names) ask for every address to be published as ready.
    let publish_not_ready = svc
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    type Addresses = (Vec<EndpointAddress>, Vec<EndpointAddress>);
    let mut groups: BTreeMap<Vec<PodPort>, Addresses> = BTreeMap::new();
    let mut slice_endpoints = Vec::new();
    let mut slice_ports: Option<Vec<PodPort>> = None;
    pods.sort_by(|a, b| pod_ip(a).cmp(pod_ip(b)));
    for pod in pods {
        let ip = pod_ip(&pod);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let terminal = matches!(phase, Some("Succeeded" | "Failed"));
        if ip.is_empty() || terminal {
            continue;
        }
        let resolved: Vec<PodPort> = ports.iter().filter_map(|p| resolve(p, &pod)).collect();
        let target = ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some(ns.to_string()),
            name: Some(name(&pod.metadata).to_string()),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        };
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        let hostname = hostname(svc, &pod).map(str::to_string);
        let address = EndpointAddress {
            ip: ip.to_string(),
            hostname: hostname.clone(),
            node_name: node.clone(),
            target_ref: Some(target.clone()),
        };
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let serving = is_ready(&pod);
        let (in_endpoints, ready) = readiness(publish_not_ready, serving, deleting);
        if let Some(listed_ready) = in_endpoints {
            let entry = groups.entry(resolved.clone()).or_default();
            if listed_ready {
                entry.0.push(address);
            } else {
                entry.1.push(address);
            }
        }
        slice_endpoints.push(Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(deleting),
            }),
            hostname,
            node_name: node,
            target_ref: Some(target),
            ..Default::default()
        });
        slice_ports.get_or_insert(resolved);
    }
    let subsets = groups
        .into_iter()
        .map(|(ports, (ready, not_ready))| EndpointSubset {
            addresses: (!ready.is_empty()).then_some(ready),
            not_ready_addresses: (!not_ready.is_empty()).then_some(not_ready),
            ports: Some(endpoint_ports(&ports)),
        })
        .collect();
    Desired {
        subsets,
        slice_endpoints,
        slice_ports: slice_ports.unwrap_or_default(),
    }
}

/// What a reconcile works with.
pub struct Endpointer {
    pods: Arc<Store<Pod>>,
    endpoints: Arc<Store<Endpoints>>,
    slices: Arc<Store<EndpointSlice>>,
    client: LocalClient,
}

/// Starts the endpoints controller until `stop`.
pub fn start(
    services: Arc<Store<Service>>,
    pods: Arc<Store<Pod>>,
    endpoints: Arc<Store<Endpoints>>,
    slices: Arc<Store<EndpointSlice>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let selecting = {
        let services = services.clone();
        move |old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>| {
            let mut keys = Vec::new();
            for pod in [old, new].into_iter().flatten() {
                for svc in services.in_namespace(namespace(&pod.metadata)) {
                    if selects(&svc, pod) {
                        keys.push(key(&svc.metadata));
                    }
                }
            }
            keys
        }
    };
    let controller = Controller::new("endpoint-controller", services)
        .watches(&pods, selecting)
        // Someone else changing a managed Endpoints object: put it back.
        .watches(&endpoints, |_, new: Option<&Arc<Endpoints>>| {
            new.map(|e| key(&e.metadata)).into_iter().collect()
        })
        // Read when a Service is reconciled; a change of one alone reconciles nothing.
        .watches(&slices, |_, _| Vec::new());
    let ctx = Arc::new(Endpointer {
        pods,
        endpoints,
        slices,
        client,
    });
    controller.run_with_cleanup(
        WORKERS,
        stop,
        ctx,
        |svc: Arc<Service>, ctx| async move { ctx.reconcile(&svc).await },
        |key: String, ctx| async move { ctx.service_gone(&key).await },
    );
}

impl Endpointer {
    /// The Service is gone: so are its Endpoints (its slices go with their owner).
    async fn service_gone(&self, key: &str) -> Result<Action, ApiError> {
        if let Some(e) = self.endpoints.get(key) {
            let objects = Objects::<Endpoints>::namespaced(&self.client, namespace(&e.metadata));
            ignore_gone(objects.delete(name(&e.metadata)).await)?;
        }
        Ok(Action::await_change())
    }

    async fn reconcile(&self, svc: &Service) -> Result<Action, ApiError> {
        if selector(svc).is_none() {
            return Ok(Action::await_change());
        }
        let pods: Vec<Arc<Pod>> = self
            .pods
            .in_namespace(namespace(&svc.metadata))
            .into_iter()
            .filter(|p| selects(svc, p))
            .collect();
        let wanted = desired(svc, pods);
        self.write_endpoints(svc, wanted.subsets).await?;
        self.write_slice(svc, wanted.slice_endpoints, wanted.slice_ports)
            .await?;
        Ok(Action::await_change())
    }

    async fn write_endpoints(
        &self,
        svc: &Service,
        subsets: Vec<EndpointSubset>,
    ) -> Result<(), ApiError> {
        let (ns, svc_name) = (namespace(&svc.metadata), name(&svc.metadata));
        let mut labels = svc.metadata.labels.clone().unwrap_or_default();
        if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
            labels.insert(HEADLESS.to_string(), String::new());
        }
        let current = self.endpoints.get(&key(&svc.metadata));
        let same = current.as_ref().is_some_and(|c| {
            c.subsets.as_deref().unwrap_or_default() == subsets.as_slice()
                && c.metadata.labels.clone().unwrap_or_default() == labels
        });
        if same {
            return Ok(());
        }
        let mut object = Endpoints {
            metadata: ObjectMeta {
                name: Some(svc_name.to_string()),
                namespace: Some(ns.to_string()),
                labels: Some(labels),
                ..Default::default()
            },
            subsets: (!subsets.is_empty()).then_some(subsets),
        };
        let objects = Objects::<Endpoints>::namespaced(&self.client, ns);
        match current {
            Some(c) => {
                object.metadata.resource_version = c.metadata.resource_version.clone();
                ignore_gone(objects.replace(svc_name, &object).await)?;
            }
            None => {
                ignore_gone(objects.create(&object).await)?;
            }
        }
        Ok(())
    }

    async fn write_slice(
        &self,
        svc: &Service,
        endpoints: Vec<Endpoint>,
        ports: Vec<PodPort>,
    ) -> Result<(), ApiError> {
        let (ns, svc_name) = (namespace(&svc.metadata), name(&svc.metadata));
        let label = |s: &EndpointSlice, l: &str| {
            s.metadata
                .labels
                .as_ref()
                .and_then(|ls| ls.get(l))
                .cloned()
                .unwrap_or_default()
        };
        let current = self.slices.in_namespace(ns).into_iter().find(|sl| {
            label(sl, SERVICE_NAME) == svc_name && label(sl, MANAGED_BY) == SLICE_MANAGER
        });
        let ports = slice_ports(&ports);
        let mut object = EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some(ns.to_string()),
                labels: Some(BTreeMap::from([
                    (SERVICE_NAME.to_string(), svc_name.to_string()),
                    (MANAGED_BY.to_string(), SLICE_MANAGER.to_string()),
                ])),
                owner_references: Some(vec![controller_ref(svc)]),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(ports),
        };
        let objects = Objects::<EndpointSlice>::namespaced(&self.client, ns);
        match current {
            Some(current) => {
                if current.endpoints == object.endpoints
                    && current.ports.as_deref().unwrap_or_default()
                        == object.ports.as_deref().unwrap_or_default()
                {
                    return Ok(());
                }
                let slice_name = name(&current.metadata);
                object.metadata.name = Some(slice_name.to_string());
                object.metadata.resource_version = current.metadata.resource_version.clone();
                ignore_gone(objects.replace(slice_name, &object).await)?;
            }
            None => {
                object.metadata.generate_name = Some(format!("{svc_name}-"));
                ignore_gone(objects.create(&object).await)?;
            }
        }
        Ok(())
    }
}

/// Ports as Endpoints hold them: an unnamed port has no name.
fn endpoint_ports(ports: &[PodPort]) -> Vec<EndpointPort> {
    ports
        .iter()
        .map(|(name, port, protocol)| EndpointPort {
            name: (!name.is_empty()).then(|| name.clone()),
            port: *port,
            protocol: Some(protocol.clone()),
            app_protocol: None,
        })
        .collect()
}

/// Ports as EndpointSlices hold them: the name is always there, empty for an unnamed port, as
/// clients dereference it.
fn slice_ports(ports: &[PodPort]) -> Vec<SlicePort> {
    ports
        .iter()
        .map(|(name, port, protocol)| SlicePort {
            name: Some(name.clone()),
            port: Some(*port),
            protocol: Some(protocol.clone()),
            app_protocol: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    fn typed<T: DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("a valid object")
    }

    #[test]
    fn target_ports_resolve_by_number_and_by_name() {
        let pod: Pod = typed(json!({"spec": {"containers": [{"name": "web", "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]}}));
        let port = |v: Value| -> ServicePort { typed(v) };
        let by_number =
            port(json!({"name": "a", "port": 80, "targetPort": 9090, "protocol": "TCP"}));
        let by_name = port(json!({"name": "b", "port": 80, "targetPort": "http"}));
        let unknown = port(json!({"port": 80, "targetPort": "metrics"}));
        let defaulted = port(json!({"port": 443}));
        assert_eq!(
            resolve(&by_number, &pod),
            Some(("a".into(), 9090, "TCP".into()))
        );
        assert_eq!(
            resolve(&by_name, &pod),
            Some(("b".into(), 8080, "TCP".into()))
        );
        assert_eq!(resolve(&unknown, &pod), None);
        assert_eq!(
            resolve(&defaulted, &pod),
            Some(("".into(), 443, "TCP".into()))
        );
    }

    #[test]
    fn a_service_selects_pods_of_its_namespace_by_every_label() {
        let svc: Service =
            typed(json!({"metadata": {"namespace": "dev"}, "spec": {"selector": {"app": "web"}}}));
        let pod = |ns: &str, app: &str| -> Pod {
            typed(json!({"metadata": {"namespace": ns, "labels": {"app": app}}}))
        };
        assert!(selects(&svc, &pod("dev", "web")));
        assert!(!selects(&svc, &pod("prod", "web")));
        assert!(!selects(&svc, &pod("dev", "db")));
        let no_selector: Service = typed(json!({"metadata": {"namespace": "dev"}, "spec": {}}));
        assert!(!selects(&no_selector, &pod("dev", "web")));
        let empty: Service =
            typed(json!({"metadata": {"namespace": "dev"}, "spec": {"selector": {}}}));
        assert!(!selects(&empty, &pod("dev", "web")));
    }

    #[test]
    fn a_pod_whose_subdomain_names_the_service_has_a_hostname_there() {
        let svc: Service = typed(json!({"metadata": {"name": "nginx", "namespace": "dev"}}));
        let pod = |ns: &str, host: &str, sub: &str| -> Pod {
            typed(json!({"metadata": {"namespace": ns},
                   "spec": {"containers": [], "hostname": host, "subdomain": sub}}))
        };
        let p = pod("dev", "web-0", "nginx");
        assert_eq!(hostname(&svc, &p), Some("web-0"));
        for (ns, host, sub) in [
            ("dev", "web-0", "other"),
            ("prod", "web-0", "nginx"),
            ("dev", "", "nginx"),
        ] {
            let p = pod(ns, host, sub);
            assert_eq!(hostname(&svc, &p), None, "{ns} {host} {sub}");
        }
    }

    #[test]
    fn ports_are_named_as_each_kind_holds_them() {
        let ports = vec![
            ("http".to_string(), 8080, "TCP".to_string()),
            (String::new(), 53, "UDP".to_string()),
        ];
        assert_eq!(
            serde_json::to_value(endpoint_ports(&ports)).unwrap(),
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"port": 53, "protocol": "UDP"}])
        );
        assert_eq!(
            serde_json::to_value(slice_ports(&ports)).unwrap(),
            json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                   {"name": "", "port": 53, "protocol": "UDP"}])
        );
    }

    #[test]
    fn published_not_ready_addresses_are_ready_terminating_or_not() {
        // (publishNotReadyAddresses, pod ready, pod terminating) -> (in Endpoints, slice ready)
        let cases = [
            ((false, true, false), (Some(true), true)),
            ((false, false, false), (Some(false), false)),
            ((false, true, true), (None, false)),
            ((false, false, true), (None, false)),
            ((true, true, false), (Some(true), true)),
            ((true, false, false), (Some(true), true)),
            ((true, true, true), (Some(true), true)),
            ((true, false, true), (Some(true), true)),
        ];
        for ((publish, serving, deleting), want) in cases {
            assert_eq!(
                readiness(publish, serving, deleting),
                want,
                "publish {publish}, ready {serving}, terminating {deleting}"
            );
        }
    }

    #[test]
    fn pods_become_ready_and_not_ready_addresses_grouped_by_their_ports() {
        let svc: Service = typed(json!({"metadata": {"name": "web", "namespace": "dev"},
            "spec": {"selector": {"app": "web"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}));
        let pod = |name: &str, ip: &str, port: i32, ready: &str, phase: &str| -> Arc<Pod> {
            Arc::new(typed(json!({
                "metadata": {"name": name, "namespace": "dev", "uid": format!("uid-{name}")},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [
                    {"name": "http", "containerPort": port}]}]},
                "status": {"podIP": ip, "phase": phase,
                           "conditions": [{"type": "Ready", "status": ready}]}})))
        };
        let wanted = desired(
            &svc,
            vec![
                pod("c", "10.0.0.3", 8080, "False", "Running"),
                pod("b", "10.0.0.2", 9090, "True", "Running"),
                pod("a", "10.0.0.1", 8080, "True", "Running"),
                pod("done", "10.0.0.4", 8080, "True", "Succeeded"),
                pod("pending", "", 8080, "False", "Pending"),
            ],
        );
        let ips = |a: &Option<Vec<EndpointAddress>>| -> Vec<String> {
            a.iter().flatten().map(|a| a.ip.clone()).collect()
        };
        let groups: Vec<(i32, Vec<String>, Vec<String>)> = wanted
            .subsets
            .iter()
            .map(|s| {
                let port = s.ports.as_ref().map_or(0, |p| p[0].port);
                (port, ips(&s.addresses), ips(&s.not_ready_addresses))
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (8080, vec!["10.0.0.1".into()], vec!["10.0.0.3".into()]),
                (9090, vec!["10.0.0.2".into()], vec![]),
            ],
            "a terminal pod and one without an IP are left out"
        );
        let slice: Vec<(String, Option<bool>)> = wanted
            .slice_endpoints
            .iter()
            .map(|e| {
                (
                    e.addresses[0].clone(),
                    e.conditions.as_ref().and_then(|c| c.ready),
                )
            })
            .collect();
        assert_eq!(
            slice,
            vec![
                ("10.0.0.1".into(), Some(true)),
                ("10.0.0.2".into(), Some(true)),
                ("10.0.0.3".into(), Some(false)),
            ]
        );
        assert_eq!(
            wanted.slice_ports,
            vec![("http".into(), 8080, "TCP".into())]
        );
        let first = &wanted.slice_endpoints[0];
        assert_eq!(first.node_name.as_deref(), Some("n1"));
        assert_eq!(
            first.target_ref.as_ref().and_then(|r| r.uid.as_deref()),
            Some("uid-a")
        );
    }
}
