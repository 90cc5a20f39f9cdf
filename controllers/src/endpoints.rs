//! Endpoints and EndpointSlices for Services with a selector: the addresses of the matching
//! pods that have an IP, ready ones under `addresses` and the others under
//! `notReadyAddresses` (in a slice: `conditions.ready`), with each Service port's targetPort
//! resolved against the pod (a named port by the container port of that name). Services without
//! a selector keep whatever Endpoints their users write.

use std::collections::BTreeMap;
use std::sync::Arc;

use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use crate::ignore_gone;
use rkube_runtime::informer::{key_of, Informer};
use rkube_runtime::queue::{Outcome, WorkQueue};

const WORKERS: usize = 2;
const SERVICE_NAME: &str = "kubernetes.io/service-name";
const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";

/// A Service port resolved for one pod: (name, port number on the pod, protocol).
type PodPort = (String, i64, String);

/// The port a Service port reaches on `pod`, or None when a named targetPort has no container
/// port of that name.
fn resolve(port: &Value, pod: &Value) -> Option<PodPort> {
    let name = s(port, "/name").to_string();
    let protocol = match s(port, "/protocol") {
        "" => "TCP".to_string(),
        p => p.to_string(),
    };
    let number = match port.get("targetPort") {
        Some(Value::Number(n)) => n.as_i64()?,
        Some(Value::String(named)) => pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)?
            .iter()
            .flat_map(|c| {
                c.get("ports")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .find(|p| s(p, "/name") == named)
            .and_then(|p| p.get("containerPort").and_then(Value::as_i64))?,
        _ => port.get("port").and_then(Value::as_i64)?,
    };
    Some((name, number, protocol))
}

/// Whether the pod has condition Ready=True.
fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True")
        })
}

pub struct Controller {
    services: Arc<Informer>,
    pods: Arc<Informer>,
    endpoints: Arc<Informer>,
    slices: Arc<Informer>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
}

impl Controller {
    pub fn new(
        services: Arc<Informer>,
        pods: Arc<Informer>,
        endpoints: Arc<Informer>,
        slices: Arc<Informer>,
        client: LocalClient,
    ) -> Arc<Controller> {
        let c = Arc::new(Controller {
            services: services.clone(),
            pods: pods.clone(),
            endpoints: endpoints.clone(),
            slices,
            client,
            queue: Arc::new(WorkQueue::new()),
        });
        let queue = c.queue.clone();
        services.on_change(Box::new(move |old, new| {
            for svc in [old, new].into_iter().flatten() {
                queue.add(&key_of(svc));
            }
        }));
        let weak = Arc::downgrade(&c);
        pods.on_change(Box::new(move |old, new| {
            let Some(c) = weak.upgrade() else { return };
            for pod in [old, new].into_iter().flatten() {
                let ns = s(pod, "/metadata/namespace");
                for svc in c.services.list(&format!("{ns}/")) {
                    if selects(&svc, pod) {
                        c.queue.add(&key_of(&svc));
                    }
                }
            }
        }));
        // Someone else changing a managed Endpoints object: put it back.
        let queue = c.queue.clone();
        endpoints.on_change(Box::new(move |_, new| {
            if let Some(e) = new {
                queue.add(&key_of(e));
            }
        }));
        c
    }

    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            "endpoint-controller",
            self.queue.clone(),
            WORKERS,
            vec![
                self.services.clone(),
                self.pods.clone(),
                self.endpoints.clone(),
                self.slices.clone(),
            ],
            stop,
            move |key| {
                let c = c.clone();
                async move { c.sync(&key).await }
            },
        );
    }

    async fn sync(&self, key: &str) -> Outcome {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(svc) = self.services.get(key) else {
            // The Service is gone: so are its Endpoints (its slices go with their owner).
            if self.endpoints.get(key).is_some() {
                let path = format!("/api/v1/namespaces/{ns}/endpoints/{name}");
                ignore_gone(self.client.delete(&path, None).await)?;
            }
            return Ok(None);
        };
        let has_selector = svc
            .pointer("/spec/selector")
            .and_then(Value::as_object)
            .is_some_and(|m| !m.is_empty());
        if !has_selector {
            return Ok(None);
        }
        let ports: Vec<Value> = svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        // Pods grouped by the ports they resolve to (Kubernetes' subsets).
        let mut groups: BTreeMap<Vec<PodPort>, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
        let mut slice_endpoints = Vec::new();
        let mut slice_ports: Option<Vec<PodPort>> = None;
        let mut pods: Vec<Arc<Value>> = self
            .pods
            .list(&format!("{ns}/"))
            .into_iter()
            .filter(|p| selects(&svc, p))
            .collect();
        pods.sort_by(|a, b| s(a, "/status/podIP").cmp(s(b, "/status/podIP")));
        for pod in pods {
            let ip = s(&pod, "/status/podIP");
            let terminal = matches!(s(&pod, "/status/phase"), "Succeeded" | "Failed");
            if ip.is_empty() || terminal {
                continue;
            }
            let resolved: Vec<PodPort> = ports.iter().filter_map(|p| resolve(p, &pod)).collect();
            let mut address = json!({"ip": ip, "targetRef": {
                "kind": "Pod", "namespace": ns, "name": s(&pod, "/metadata/name"),
                "uid": s(&pod, "/metadata/uid")}});
            let node = s(&pod, "/spec/nodeName");
            if !node.is_empty() {
                address["nodeName"] = json!(node);
            }
            let hostname = hostname(&svc, &pod);
            if let Some(h) = hostname {
                address["hostname"] = json!(h);
            }
            let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
            let ready = is_ready(&pod) && !deleting;
            let entry = groups.entry(resolved.clone()).or_default();
            if ready {
                entry.0.push(address.clone());
            } else {
                entry.1.push(address.clone());
            }
            let mut ep = json!({
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": is_ready(&pod), "terminating": deleting},
                "targetRef": address["targetRef"].clone(),
            });
            if !node.is_empty() {
                ep["nodeName"] = json!(node);
            }
            if let Some(h) = hostname {
                ep["hostname"] = json!(h);
            }
            slice_endpoints.push(ep);
            slice_ports.get_or_insert(resolved);
        }
        let subsets: Vec<Value> = groups
            .into_iter()
            .map(|(ports, (ready, not_ready))| {
                let mut subset = json!({"ports": ports_json(&ports, false)});
                if !ready.is_empty() {
                    subset["addresses"] = json!(ready);
                }
                if !not_ready.is_empty() {
                    subset["notReadyAddresses"] = json!(not_ready);
                }
                subset
            })
            .collect();
        self.write_endpoints(&svc, subsets).await?;
        self.write_slice(&svc, slice_endpoints, slice_ports.unwrap_or_default())
            .await?;
        Ok(None)
    }

    async fn write_endpoints(&self, svc: &Value, subsets: Vec<Value>) -> Result<(), ApiError> {
        let ns = s(svc, "/metadata/namespace");
        let name = s(svc, "/metadata/name");
        let mut labels = svc
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        if s(svc, "/spec/clusterIP") == "None" {
            labels["service.kubernetes.io/headless"] = json!("");
        }
        let current = self.endpoints.get(&format!("{ns}/{name}"));
        let same = current.as_ref().is_some_and(|c| {
            c.get("subsets").cloned().unwrap_or(json!([])) == json!(subsets)
                && c.pointer("/metadata/labels").cloned().unwrap_or(json!({})) == labels
        });
        if same {
            return Ok(());
        }
        let mut object = json!({
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
        });
        if !subsets.is_empty() {
            object["subsets"] = json!(subsets);
        }
        match current {
            Some(c) => {
                object["metadata"]["resourceVersion"] = json!(s(&c, "/metadata/resourceVersion"));
                let path = format!("/api/v1/namespaces/{ns}/endpoints/{name}");
                ignore_gone(self.client.update(&path, &object).await)?;
            }
            None => {
                let path = format!("/api/v1/namespaces/{ns}/endpoints");
                ignore_gone(self.client.create(&path, &object).await)?;
            }
        }
        Ok(())
    }

    async fn write_slice(
        &self,
        svc: &Value,
        endpoints: Vec<Value>,
        ports: Vec<PodPort>,
    ) -> Result<(), ApiError> {
        let ns = s(svc, "/metadata/namespace");
        let name = s(svc, "/metadata/name");
        let uid = s(svc, "/metadata/uid");
        let mine: Vec<Arc<Value>> = self
            .slices
            .list(&format!("{ns}/"))
            .into_iter()
            .filter(|sl| {
                s(
                    sl,
                    &format!("/metadata/labels/{}", SERVICE_NAME.replace('/', "~1")),
                ) == name
                    && s(
                        sl,
                        &format!("/metadata/labels/{}", MANAGED_BY.replace('/', "~1")),
                    ) == SLICE_MANAGER
            })
            .collect();
        let mut object = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "namespace": ns,
                "labels": {SERVICE_NAME: name, MANAGED_BY: SLICE_MANAGER},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                     "uid": uid, "controller": true, "blockOwnerDeletion": true}],
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports_json(&ports, true),
        });
        match mine.first() {
            Some(current) => {
                if current.get("endpoints").cloned().unwrap_or(json!([])) == object["endpoints"]
                    && current.get("ports").cloned().unwrap_or(json!([])) == object["ports"]
                {
                    return Ok(());
                }
                let sname = s(current, "/metadata/name");
                object["metadata"]["name"] = json!(sname);
                object["metadata"]["resourceVersion"] =
                    json!(s(current, "/metadata/resourceVersion"));
                let path =
                    format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/{sname}");
                ignore_gone(self.client.update(&path, &object).await)?;
            }
            None => {
                object["metadata"]["generateName"] = json!(format!("{name}-"));
                let path = format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices");
                ignore_gone(self.client.create(&path, &object).await)?;
            }
        }
        Ok(())
    }
}

/// Ports as Endpoints (`always_named` false: an unnamed port has no name) or EndpointSlices
/// (true: the name is always there, empty for an unnamed port, as clients dereference it) hold
/// them.
fn ports_json(ports: &[PodPort], always_named: bool) -> Value {
    json!(ports
        .iter()
        .map(|(name, port, protocol)| {
            let mut p = json!({"port": port, "protocol": protocol});
            if always_named || !name.is_empty() {
                p["name"] = json!(name);
            }
            p
        })
        .collect::<Vec<_>>())
}

/// Whether a Service's selector (a plain label map) selects the pod.
/// The hostname an endpoint of the pod has: the pod's own, when its subdomain names the
/// Service (Kubernetes' `ShouldSetHostname`; what gives a StatefulSet's pods their DNS names
/// through the governing Service).
fn hostname<'a>(svc: &Value, pod: &'a Value) -> Option<&'a str> {
    let hostname = s(pod, "/spec/hostname");
    let named = s(pod, "/spec/subdomain") == s(svc, "/metadata/name")
        && s(pod, "/metadata/namespace") == s(svc, "/metadata/namespace");
    (!hostname.is_empty() && named).then_some(hostname)
}

fn selects(svc: &Value, pod: &Value) -> bool {
    let Some(sel) = svc.pointer("/spec/selector").and_then(Value::as_object) else {
        return false;
    };
    if sel.is_empty() || s(svc, "/metadata/namespace") != s(pod, "/metadata/namespace") {
        return false;
    }
    let labels = pod.pointer("/metadata/labels").and_then(Value::as_object);
    sel.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_ports_resolve_by_number_and_by_name() {
        let pod = json!({"spec": {"containers": [{"name": "web", "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]}});
        let by_number = json!({"name": "a", "port": 80, "targetPort": 9090, "protocol": "TCP"});
        let by_name = json!({"name": "b", "port": 80, "targetPort": "http"});
        let unknown = json!({"port": 80, "targetPort": "metrics"});
        let defaulted = json!({"port": 443});
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
        let svc = json!({"metadata": {"namespace": "dev"}, "spec": {"selector": {"app": "web"}}});
        let pod =
            |ns: &str, app: &str| json!({"metadata": {"namespace": ns, "labels": {"app": app}}});
        assert!(selects(&svc, &pod("dev", "web")));
        assert!(!selects(&svc, &pod("prod", "web")));
        assert!(!selects(&svc, &pod("dev", "db")));
        let no_selector = json!({"metadata": {"namespace": "dev"}, "spec": {}});
        assert!(!selects(&no_selector, &pod("dev", "web")));
    }

    #[test]
    fn a_pod_whose_subdomain_names_the_service_has_a_hostname_there() {
        let svc = json!({"metadata": {"name": "nginx", "namespace": "dev"}});
        let pod = |ns: &str, host: &str, sub: &str| {
            json!({"metadata": {"namespace": ns},
                   "spec": {"hostname": host, "subdomain": sub}})
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
}
