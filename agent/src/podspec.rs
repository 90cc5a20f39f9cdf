//! What a container gets besides its image: volumes (emptyDir, hostPath, configMap, secret,
//! and projected ones through [`crate::projected`]) made on the node and mounted, and
//! environment variables — the `kubernetes` Service's address (as the kubelet gives every
//! container), literal values, keys of ConfigMaps and Secrets (`valueFrom`, `envFrom`) and the
//! downward API's pod fields. The node
//! reads only the ConfigMaps and Secrets its own pods use (the Node authorizer allows exactly
//! those).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Volume,
};
use kube::api::Api;
use rkube_core::meta;

use crate::cri::pb;

/// The pod's volumes.
pub(crate) fn pod_volumes(pod: &Pod) -> impl Iterator<Item = &Volume> {
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten())
}

/// The pod's containers (`init`: its init containers), in the spec's order.
pub(crate) fn pod_containers(pod: &Pod, init: bool) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(move |s| {
        if init {
            s.init_containers.as_deref().unwrap_or_default().iter()
        } else {
            s.containers.iter()
        }
    })
}

/// A string field of the pod's spec ("" when the spec or the field is absent).
pub(crate) fn spec_str(
    pod: &Pod,
    field: impl Fn(&k8s_openapi::api::core::v1::PodSpec) -> Option<&String>,
) -> &str {
    pod.spec
        .as_ref()
        .and_then(field)
        .map(String::as_str)
        .unwrap_or("")
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
    pod: &Pod,
    root: &Path,
) -> Result<HashMap<String, PathBuf>> {
    let ns = meta::namespace(&pod.metadata);
    let base = root.join(meta::uid(&pod.metadata)).join("volumes");
    let mut out = HashMap::new();
    for v in pod_volumes(pod) {
        let name = v.name.clone();
        let dir = base.join(&name);
        let config_map = v
            .config_map
            .as_ref()
            .map(|c| ("configMap", c.name.as_str(), c.optional, c.items.as_deref()));
        let secret = v.secret.as_ref().map(|c| {
            let name = c.secret_name.as_deref().unwrap_or("");
            ("secret", name, c.optional, c.items.as_deref())
        });
        let path = if v.empty_dir.is_some() {
            std::fs::create_dir_all(&dir)?;
            dir
        } else if let Some(hp) = &v.host_path {
            let p = PathBuf::from(&hp.path);
            match hp.type_.as_deref().unwrap_or("") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p)?,
                "Directory" if !p.is_dir() => bail!("hostPath {} is not a directory", p.display()),
                _ => {}
            }
            p
        } else if let Some((kind, obj, optional, items)) = config_map.or(secret) {
            let data = match object_data(client, ns, kind, obj).await {
                Ok(d) => d,
                Err(_) if optional.unwrap_or(false) => HashMap::new(),
                Err(e) => return Err(e),
            };
            write_keys(&base, &name, kind, obj, &data, items.unwrap_or_default())?;
            dir
        } else if let Some(claim) = &v.persistent_volume_claim {
            claim_directory(client, ns, &claim.claim_name)
                .await
                .with_context(|| format!("MountVolume.SetUp failed for volume {name:?}"))?
        } else if let Some(projected) = &v.projected {
            crate::projected::project(client, pod, projected, &dir)
                .await
                .with_context(|| format!("MountVolume.SetUp failed for volume {name:?}"))?;
            dir
        } else {
            let kind = unsupported_kind(v);
            bail!("volume {name}: {kind} volumes are not supported by this agent yet");
        };
        out.insert(name, path);
    }
    Ok(out)
}

/// Writes a ConfigMap's or Secret's keys (all, or the `items` named) into the volume `name`
/// under `base`: written aside and swapped in whole, as the kubelet's atomic writer does.
fn write_keys(
    base: &Path,
    name: &str,
    kind: &str,
    obj: &str,
    data: &HashMap<String, Vec<u8>>,
    items: &[KeyToPath],
) -> Result<()> {
    let tmp = base.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let files: Vec<(&str, &str)> = if items.is_empty() {
        data.keys().map(|k| (k.as_str(), k.as_str())).collect()
    } else {
        items
            .iter()
            .map(|i| (i.key.as_str(), i.path.as_str()))
            .collect()
    };
    for (key, rel) in files {
        let Some(bytes) = data.get(key) else {
            bail!("{kind} \"{obj}\" has no key {key:?}");
        };
        if rel.contains("..") || rel.starts_with('/') {
            bail!("volume {name}: path {rel:?} must be relative and may not contain '..'");
        }
        let file = tmp.join(rel);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
    }
    let dir = base.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)?;
    Ok(())
}

/// The API's name of a volume source this agent does not make ("" when it names none).
fn unsupported_kind(v: &Volume) -> &'static str {
    [
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("cinder", v.cinder.is_some()),
        ("csi", v.csi.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("image", v.image.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("nfs", v.nfs.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("rbd", v.rbd.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
    ]
    .into_iter()
    .find_map(|(kind, set)| set.then_some(kind))
    .unwrap_or("")
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
pub fn read_only_volumes(pod: &Pod) -> HashSet<String> {
    pod_volumes(pod)
        .filter(|v| {
            v.persistent_volume_claim
                .as_ref()
                .and_then(|c| c.read_only)
                .unwrap_or(false)
        })
        .map(|v| v.name.clone())
        .collect()
}

/// The container's mounts of the pod's volumes (read-only where the mount or the volume says).
pub fn mounts(
    container: &Container,
    volumes: &HashMap<String, PathBuf>,
    read_only: &HashSet<String>,
) -> Result<Vec<pb::Mount>> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| {
            let name = m.name.as_str();
            let host = volumes
                .get(name)
                .ok_or_else(|| anyhow!("volumeMount {name:?} names no volume of the pod"))?;
            let host = match m.sub_path.as_deref().unwrap_or("") {
                "" => host.clone(),
                sub => host.join(sub),
            };
            Ok(pb::Mount {
                container_path: m.mount_path.clone(),
                host_path: host.display().to_string(),
                readonly: m.read_only.unwrap_or(false) || read_only.contains(name),
            })
        })
        .collect()
}

/// A downward API field of the pod.
pub(crate) fn field(pod: &Pod, path: &str, pod_ip: &str) -> Result<String> {
    let m = &pod.metadata;
    let map_key = |map: Option<&std::collections::BTreeMap<String, String>>, prefix: &str| {
        let key = path.trim_start_matches(prefix).trim_end_matches("']");
        map.and_then(|l| l.get(key)).cloned().unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => meta::name(m).into(),
        "metadata.namespace" => meta::namespace(m).into(),
        "metadata.uid" => meta::uid(m).into(),
        "spec.nodeName" => spec_str(pod, |s| s.node_name.as_ref()).into(),
        "spec.serviceAccountName" => spec_str(pod, |s| s.service_account_name.as_ref()).into(),
        "status.podIP" => pod_ip.into(),
        "status.hostIP" => pod
            .status
            .as_ref()
            .and_then(|s| s.host_ip.clone())
            .unwrap_or_default(),
        p if p.starts_with("metadata.labels['") => map_key(m.labels.as_ref(), "metadata.labels['"),
        p if p.starts_with("metadata.annotations['") => {
            map_key(m.annotations.as_ref(), "metadata.annotations['")
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
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
) -> Result<Vec<pb::KeyValue>> {
    let ns = meta::namespace(&pod.metadata);
    let mut out: Vec<(String, String)> = kubernetes_service_env(client).await;
    let set = |k: String, v: String, out: &mut Vec<(String, String)>| {
        out.retain(|(x, _)| *x != k);
        out.push((k, v));
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(c), _) => ("configMap", &c.name, c.optional),
            (_, Some(c)) => ("secret", &c.name, c.optional),
            _ => continue,
        };
        let data = match object_data(client, ns, kind, name).await {
            Ok(d) => d,
            Err(_) if optional.unwrap_or(false) => continue,
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
    for e in container.env.iter().flatten() {
        let name = e.name.clone();
        let value = match &e.value_from {
            None => e.value.clone().unwrap_or_default(),
            Some(from) => {
                let key_ref = from
                    .config_map_key_ref
                    .as_ref()
                    .map(|r| ("configMap", &r.name, &r.key, r.optional))
                    .or_else(|| {
                        from.secret_key_ref
                            .as_ref()
                            .map(|r| ("secret", &r.name, &r.key, r.optional))
                    });
                if let Some(f) = &from.field_ref {
                    field(pod, &f.field_path, pod_ip)?
                } else if let Some((kind, obj, key, optional)) = key_ref {
                    let optional = optional.unwrap_or(false);
                    match object_data(client, ns, kind, obj).await {
                        Ok(d) => match d.get(key) {
                            Some(v) => String::from_utf8_lossy(v).into(),
                            None if optional => continue,
                            None => bail!("couldn't find key {key} in {kind} {ns}/{obj}"),
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

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web"}, "annotations": {"team": "a"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "builder",
                "containers": [{"name": "c", "volumeMounts": [
                    {"name": "data", "mountPath": "/data", "subPath": "x"},
                    {"name": "conf", "mountPath": "/etc/conf", "readOnly": true}]}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "d", "readOnly": true}},
                    {"name": "conf", "configMap": {"name": "conf"}},
                    {"name": "nfs", "nfs": {"server": "s", "path": "/"}}]},
            "status": {"hostIP": "10.0.0.9"}}))
        .unwrap()
    }

    #[test]
    fn downward_api_fields_come_from_the_pod() {
        let pod = pod();
        let cases = [
            ("metadata.name", "web-1"),
            ("metadata.namespace", "shop"),
            ("metadata.uid", "u-1"),
            ("spec.nodeName", "n1"),
            ("spec.serviceAccountName", "builder"),
            ("status.podIP", "10.244.0.5"),
            ("status.hostIP", "10.0.0.9"),
            ("metadata.labels['app']", "web"),
            ("metadata.labels['absent']", ""),
            ("metadata.annotations['team']", "a"),
        ];
        for (path, want) in cases {
            assert_eq!(field(&pod, path, "10.244.0.5").unwrap(), want, "{path}");
        }
        assert!(field(&pod, "spec.schedulerName", "").is_err());
    }

    #[test]
    fn mounts_follow_the_volumes_and_their_read_only_flags() {
        let pod = pod();
        let read_only = read_only_volumes(&pod);
        assert_eq!(read_only, HashSet::from(["data".to_string()]));
        let volumes: HashMap<String, PathBuf> = [("data", "/v/data"), ("conf", "/v/conf")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), PathBuf::from(v)))
            .collect();
        let c = pod_containers(&pod, false).next().unwrap();
        let got: Vec<(String, String, bool)> = mounts(c, &volumes, &read_only)
            .unwrap()
            .into_iter()
            .map(|m| (m.container_path, m.host_path, m.readonly))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/data".into(), "/v/data/x".into(), true),
                ("/etc/conf".into(), "/v/conf".into(), true),
            ]
        );
        assert!(mounts(c, &HashMap::new(), &read_only).is_err());
        let kinds: Vec<&str> = pod_volumes(&pod).map(unsupported_kind).collect();
        assert_eq!(kinds, vec!["", "", "nfs"]);
    }

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
