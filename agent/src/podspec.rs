//! What a container gets besides its image: volumes (emptyDir, hostPath, configMap, secret,
//! and projected ones through [`crate::projected`]) made on the node and mounted, and
//! environment variables — the `kubernetes` Service's address (as the kubelet gives every
//! container), literal values, keys of ConfigMaps and Secrets (`valueFrom`, `envFrom`) and the
//! downward API's pod fields. The node
//! reads only the ConfigMaps and Secrets its own pods use (the Node authorizer allows exactly
//! those).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::Api;
use rkube_core::json::str_at as s;
use serde_json::Value;

use crate::cri::pb;

fn arr<'a>(v: &'a Value, p: &str) -> Vec<&'a Value> {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// A ConfigMap's or Secret's keys, decoded.
pub(crate) async fn object_data(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<HashMap<String, Vec<u8>>> {
    match kind {
        "configMap" => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(|e| {
                    anyhow!(
                        "configmap \"{name}\" not found: {}",
                        crate::join::describe(&e)
                    )
                })?;
            let mut out: HashMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                out.insert(k, v.0);
            }
            Ok(out)
        }
        _ => {
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(|e| {
                    anyhow!("secret \"{name}\" not found: {}", crate::join::describe(&e))
                })?;
            let mut out: HashMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in secret.string_data.unwrap_or_default() {
                out.insert(k, v.into_bytes());
            }
            Ok(out)
        }
    }
}

/// Makes the pod's volumes under `root` (`<root>/<uid>/volumes/<name>`); volume name -> host
/// path.
pub async fn volumes(
    client: &kube::Client,
    pod: &Value,
    root: &Path,
) -> Result<HashMap<String, PathBuf>> {
    let ns = s(pod, "/metadata/namespace");
    let base = root.join(s(pod, "/metadata/uid")).join("volumes");
    let mut out = HashMap::new();
    for v in arr(pod, "/spec/volumes") {
        let name = s(v, "/name").to_string();
        let dir = base.join(&name);
        let path = if v.get("emptyDir").is_some() {
            std::fs::create_dir_all(&dir)?;
            dir
        } else if let Some(hp) = v.get("hostPath") {
            let p = PathBuf::from(s(hp, "/path"));
            match s(hp, "/type") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p)?,
                "Directory" if !p.is_dir() => bail!("hostPath {} is not a directory", p.display()),
                _ => {}
            }
            p
        } else if let Some((kind, src)) = v
            .get("configMap")
            .map(|c| ("configMap", c))
            .or_else(|| v.get("secret").map(|c| ("secret", c)))
        {
            let obj = if kind == "configMap" {
                s(src, "/name")
            } else {
                s(src, "/secretName")
            };
            let optional = src
                .get("optional")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let data = match object_data(client, ns, kind, obj).await {
                Ok(d) => d,
                Err(_) if optional => HashMap::new(),
                Err(e) => return Err(e),
            };
            // Written aside and swapped in whole, as the kubelet's atomic writer does.
            let tmp = base.join(format!(".{name}.tmp"));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp)?;
            let items = arr(src, "/items");
            let files: Vec<(String, String)> = if items.is_empty() {
                data.keys().map(|k| (k.clone(), k.clone())).collect()
            } else {
                items
                    .iter()
                    .map(|i| (s(i, "/key").to_string(), s(i, "/path").to_string()))
                    .collect()
            };
            for (key, rel) in files {
                let Some(bytes) = data.get(&key) else {
                    bail!("{kind} \"{obj}\" has no key {key:?}");
                };
                if rel.contains("..") || rel.starts_with('/') {
                    bail!("volume {name}: path {rel:?} must be relative and may not contain '..'");
                }
                let file = tmp.join(&rel);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&file, bytes)?;
            }
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)?;
            dir
        } else if let Some(claim) = v.get("persistentVolumeClaim") {
            claim_directory(client, ns, s(claim, "/claimName"))
                .await
                .with_context(|| format!("MountVolume.SetUp failed for volume {name:?}"))?
        } else if v.get("projected").is_some() {
            crate::projected::project(client, pod, v, &dir)
                .await
                .with_context(|| format!("MountVolume.SetUp failed for volume {name:?}"))?;
            dir
        } else {
            let kind = v
                .as_object()
                .and_then(|o| o.keys().find(|k| k.as_str() != "name").cloned())
                .unwrap_or_default();
            bail!("volume {name}: {kind} volumes are not supported by this agent yet");
        };
        out.insert(name, path);
    }
    Ok(out)
}

/// The directory of a PersistentVolumeClaim's volume on this node: the bound volume's
/// hostPath (made when its type is DirectoryOrCreate, as a local-path volume's is) or local
/// path (which must exist).
async fn claim_directory(client: &kube::Client, ns: &str, claim: &str) -> Result<PathBuf> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = claims.get(claim).await.map_err(|e| {
        anyhow!(
            "persistentvolumeclaim \"{claim}\" not found: {}",
            crate::join::describe(&e)
        )
    })?;
    let volume = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| anyhow!("PVC {ns}/{claim} is not bound"))?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv = volumes.get(&volume).await.map_err(|e| {
        anyhow!(
            "persistentvolume \"{volume}\" not found: {}",
            crate::join::describe(&e)
        )
    })?;
    let spec = pv.spec.unwrap_or_default();
    if let Some(hp) = spec.host_path {
        let p = PathBuf::from(&hp.path);
        match hp.type_.as_deref().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(&p)?,
            "Directory" if !p.is_dir() => bail!(
                "hostPath type check failed: {} is not a directory",
                p.display()
            ),
            _ => {}
        }
        return Ok(p);
    }
    if let Some(local) = spec.local {
        let p = PathBuf::from(&local.path);
        if !p.exists() {
            bail!("path {:?} does not exist", local.path);
        }
        return Ok(p);
    }
    bail!("volume {volume:?}: only hostPath and local persistent volumes are mounted by this agent")
}

/// The pod's volumes that every container mounts read-only (a claim marked readOnly).
pub fn read_only_volumes(pod: &Value) -> std::collections::HashSet<String> {
    arr(pod, "/spec/volumes")
        .iter()
        .filter(|v| {
            v.pointer("/persistentVolumeClaim/readOnly")
                .and_then(Value::as_bool)
                .unwrap_or(false)
        })
        .map(|v| s(v, "/name").to_string())
        .collect()
}

/// The container's mounts of the pod's volumes (read-only where the mount or the volume says).
pub fn mounts(
    container: &Value,
    volumes: &HashMap<String, PathBuf>,
    read_only: &std::collections::HashSet<String>,
) -> Result<Vec<pb::Mount>> {
    arr(container, "/volumeMounts")
        .into_iter()
        .map(|m| {
            let name = s(m, "/name");
            let host = volumes
                .get(name)
                .ok_or_else(|| anyhow!("volumeMount {name:?} names no volume of the pod"))?;
            let sub = s(m, "/subPath");
            let host = if sub.is_empty() {
                host.clone()
            } else {
                host.join(sub)
            };
            Ok(pb::Mount {
                container_path: s(m, "/mountPath").to_string(),
                host_path: host.display().to_string(),
                readonly: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false)
                    || read_only.contains(name),
            })
        })
        .collect()
}

/// A downward API field of the pod.
pub(crate) fn field(pod: &Value, path: &str, pod_ip: &str) -> Result<String> {
    Ok(match path {
        "metadata.name" => s(pod, "/metadata/name").into(),
        "metadata.namespace" => s(pod, "/metadata/namespace").into(),
        "metadata.uid" => s(pod, "/metadata/uid").into(),
        "spec.nodeName" => s(pod, "/spec/nodeName").into(),
        "spec.serviceAccountName" => s(pod, "/spec/serviceAccountName").into(),
        "status.podIP" => pod_ip.into(),
        "status.hostIP" => s(pod, "/status/hostIP").into(),
        p if p.starts_with("metadata.labels['") => {
            let key = p
                .trim_start_matches("metadata.labels['")
                .trim_end_matches("']");
            pod.pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
                .into()
        }
        p if p.starts_with("metadata.annotations['") => {
            let key = p
                .trim_start_matches("metadata.annotations['")
                .trim_end_matches("']");
            pod.pointer("/metadata/annotations")
                .and_then(|a| a.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
                .into()
        }
        other => bail!("fieldRef {other:?} is not supported"),
    })
}

/// Five random characters (a generated name's suffix).
pub(crate) fn random_suffix() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::thread_rng();
    (0..5)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect()
}

/// The variables of a Service as the kubelet writes them (`<NAME>_SERVICE_HOST`, `_PORT`, a
/// `_SERVICE_PORT_<PORT NAME>` per named port, and Docker links' `<NAME>_PORT*`), for a
/// Service with a cluster IP.
pub fn service_env(service: &k8s_openapi::api::core::v1::Service) -> Vec<(String, String)> {
    let spec = service.spec.clone().unwrap_or_default();
    let ip = spec.cluster_ip.unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    if ip.is_empty() || ip == "None" || ports.is_empty() {
        return Vec::new();
    }
    let upper = |s: &str| s.to_uppercase().replace('-', "_");
    let prefix = upper(service.metadata.name.as_deref().unwrap_or(""));
    let mut out = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()),
    ];
    for p in &ports {
        if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
            out.push((
                format!("{prefix}_SERVICE_PORT_{}", upper(n)),
                p.port.to_string(),
            ));
        }
    }
    let proto = |p: &k8s_openapi::api::core::v1::ServicePort| {
        p.protocol.clone().unwrap_or_else(|| "TCP".into())
    };
    out.push((
        format!("{prefix}_PORT"),
        format!(
            "{}://{ip}:{}",
            proto(&ports[0]).to_lowercase(),
            ports[0].port
        ),
    ));
    for p in &ports {
        let pr = proto(p);
        let base = format!("{prefix}_PORT_{}_{}", p.port, pr.to_uppercase());
        out.push((
            base.clone(),
            format!("{}://{ip}:{}", pr.to_lowercase(), p.port),
        ));
        out.push((format!("{base}_PROTO"), pr.to_lowercase()));
        out.push((format!("{base}_PORT"), p.port.to_string()));
        out.push((format!("{base}_ADDR"), ip.clone()));
    }
    out
}

/// The `kubernetes` Service's variables, which the kubelet gives every container whatever
/// its pod's `enableServiceLinks` (in-cluster clients find the API by them); none when the
/// Service cannot be read.
async fn kubernetes_service_env(client: &kube::Client) -> Vec<(String, String)> {
    let api = Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default");
    match api.get("kubernetes").await {
        Ok(svc) => service_env(&svc),
        Err(e) => {
            tracing::warn!(error = %crate::join::describe(&e), "reading the kubernetes Service failed; containers start without KUBERNETES_SERVICE_HOST");
            Vec::new()
        }
    }
}

/// The container's environment, in Kubernetes' order: the `kubernetes` Service's variables,
/// then envFrom, then env (later wins).
pub async fn env(
    client: &kube::Client,
    pod: &Value,
    container: &Value,
    pod_ip: &str,
) -> Result<Vec<pb::KeyValue>> {
    let ns = s(pod, "/metadata/namespace");
    let mut out: Vec<(String, String)> = kubernetes_service_env(client).await;
    let set = |k: String, v: String, out: &mut Vec<(String, String)>| {
        out.retain(|(x, _)| *x != k);
        out.push((k, v));
    };
    for from in arr(container, "/envFrom") {
        let prefix = s(from, "/prefix");
        let (kind, src) = match (from.get("configMapRef"), from.get("secretRef")) {
            (Some(c), _) => ("configMap", c),
            (_, Some(c)) => ("secret", c),
            _ => continue,
        };
        let optional = src
            .get("optional")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let data = match object_data(client, ns, kind, s(src, "/name")).await {
            Ok(d) => d,
            Err(_) if optional => continue,
            Err(e) => return Err(e),
        };
        let mut keys: Vec<_> = data.into_iter().collect();
        keys.sort();
        for (k, v) in keys {
            set(
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into(),
                &mut out,
            );
        }
    }
    for e in arr(container, "/env") {
        let name = s(e, "/name").to_string();
        let value = match e.get("valueFrom") {
            None => s(e, "/value").to_string(),
            Some(from) => {
                if let Some(f) = from.get("fieldRef") {
                    field(pod, s(f, "/fieldPath"), pod_ip)?
                } else if let Some((kind, r)) = from
                    .get("configMapKeyRef")
                    .map(|r| ("configMap", r))
                    .or_else(|| from.get("secretKeyRef").map(|r| ("secret", r)))
                {
                    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                    let key = s(r, "/key");
                    match object_data(client, ns, kind, s(r, "/name")).await {
                        Ok(d) => match d.get(key) {
                            Some(v) => String::from_utf8_lossy(v).into(),
                            None if optional => continue,
                            None => {
                                bail!("couldn't find key {key} in {kind} {}/{}", ns, s(r, "/name"))
                            }
                        },
                        Err(_) if optional => continue,
                        Err(e) => return Err(e),
                    }
                } else {
                    bail!("env {name}: this valueFrom is not supported yet");
                }
            }
        };
        set(name, value, &mut out);
    }
    Ok(out
        .into_iter()
        .map(|(key, value)| pb::KeyValue { key, value })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubernetes_service_variables_are_the_kubelet_s() {
        let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.1",
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}}))
        .unwrap();
        let env: HashMap<String, String> = service_env(&svc).into_iter().collect();
        let want = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
        ];
        assert_eq!(env.len(), want.len(), "{env:?}");
        for (k, v) in want {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        let mut headless = svc.clone();
        headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert!(service_env(&headless).is_empty());
    }
}
