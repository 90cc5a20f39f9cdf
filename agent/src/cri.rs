//! The `cri` runtime: pods run by a CRI runtime (containerd's cri plugin) over its unix socket.
//! A pod is a sandbox (its network namespace set up by the runtime's CNI plugins) holding one
//! container per spec container; the agent creates and starts them, reads their state back,
//! restarts exited containers as the pod's restartPolicy says (with the kubelet's back-off,
//! 10 s doubling to 5 minutes), and stops and removes them when the pod is deleted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::core::v1::{Container, Pod};
use rkube_core::meta;

use crate::podspec::spec_str;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod pb {
    tonic::include_proto!("runtime.v1");
}

use pb::image_service_client::ImageServiceClient;
use pb::runtime_service_client::RuntimeServiceClient;

/// Labels that tie the runtime's objects to their pod, as the kubelet sets them.
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";

#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    /// Where container logs go (`<dir>/<ns>_<name>_<uid>/<container>/<attempt>.log`).
    log_root: PathBuf,
    /// Cluster DNS servers and domain for pods' resolv.conf.
    dns: Vec<String>,
    domain: String,
}

/// A container's state as the pod status reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    pub name: String,
    pub id: String,
    pub image: String,
    pub image_ref: String,
    pub state: i32,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
}

impl ContainerView {
    pub fn running(&self) -> bool {
        self.state == pb::ContainerState::ContainerRunning as i32
    }
    pub fn exited(&self) -> bool {
        self.state == pb::ContainerState::ContainerExited as i32
    }
}

impl Cri {
    /// Connects to the runtime's unix socket.
    pub async fn connect(socket: &Path, log_root: &Path) -> Result<Cri> {
        let path = socket.to_path_buf();
        // The URI is not used: every connection goes to the socket.
        let channel = Endpoint::try_from("http://cri.local")?
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .with_context(|| {
                format!(
                    "connecting to the container runtime at {}",
                    socket.display()
                )
            })?;
        std::fs::create_dir_all(log_root)?;
        Ok(Cri {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            log_root: log_root.to_path_buf(),
            dns: Vec::new(),
            domain: "cluster.local".into(),
        })
    }

    /// Pods with dnsPolicy ClusterFirst resolve with these servers, searching their namespace's
    /// Services first.
    pub fn with_dns(mut self, servers: Vec<String>, domain: String) -> Cri {
        self.dns = servers;
        self.domain = domain;
        self
    }

    /// A pod's resolv.conf as the kubelet makes it: ClusterFirst (the default) points at the
    /// cluster DNS with the search path `<ns>.svc.<domain> svc.<domain> <domain>` and ndots:5;
    /// Default leaves the node's; None uses only the pod's dnsConfig, which otherwise adds to
    /// what the policy gives.
    pub fn dns_config(&self, pod: &Pod) -> Option<pb::DnsConfig> {
        let policy = match spec_str(pod, |s| s.dns_policy.as_ref()) {
            "" => "ClusterFirst",
            p => p,
        };
        let mut cfg = match policy {
            "ClusterFirst" | "ClusterFirstWithHostNet" if !self.dns.is_empty() => {
                let ns = meta::namespace(&pod.metadata);
                let d = &self.domain;
                pb::DnsConfig {
                    servers: self.dns.clone(),
                    searches: vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()],
                    options: vec!["ndots:5".into()],
                }
            }
            "None" => pb::DnsConfig::default(),
            _ => return None,
        };
        let Some(given) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) else {
            return Some(cfg);
        };
        cfg.servers
            .extend(given.nameservers.iter().flatten().cloned());
        cfg.searches
            .extend(given.searches.iter().flatten().cloned());
        for o in given.options.iter().flatten() {
            let name = o.name.as_deref().unwrap_or("");
            cfg.options.retain(|x| x.split(':').next() != Some(name));
            cfg.options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name.to_string(),
            });
        }
        Some(cfg)
    }

    /// Where pods' volumes are made (`<root>/<uid>/volumes/<name>`).
    pub fn volume_root(&self) -> PathBuf {
        self.log_root
            .parent()
            .unwrap_or(&self.log_root)
            .join("volumes")
    }

    /// `<runtime name>://<version>`, as the Node's containerRuntimeVersion says it.
    pub async fn version(&self) -> Result<String> {
        let v = self
            .runtime
            .clone()
            .version(pb::VersionRequest {
                version: "v1".into(),
            })
            .await?
            .into_inner();
        Ok(format!("{}://{}", v.runtime_name, v.runtime_version))
    }

    fn sandbox_config(&self, pod: &Pod) -> pb::PodSandboxConfig {
        let (ns, name, uid) = (
            meta::namespace(&pod.metadata),
            meta::name(&pod.metadata),
            meta::uid(&pod.metadata),
        );
        let labels: HashMap<String, String> =
            [(POD_UID, uid), (POD_NAME, name), (POD_NAMESPACE, ns)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        pb::PodSandboxConfig {
            metadata: Some(pb::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: ns.into(),
                attempt: 0,
            }),
            hostname: pod_hostname(pod),
            dns_config: self.dns_config(pod),
            log_directory: self
                .log_root
                .join(format!("{ns}_{name}_{uid}"))
                .display()
                .to_string(),
            labels,
            linux: Some(pb::LinuxPodSandboxConfig {
                cgroup_parent: String::new(),
                security_context: Some(pb::LinuxSandboxSecurityContext {
                    namespace_options: Some(pb::NamespaceOption {
                        network: pb::NamespaceMode::Pod as i32,
                        pid: pb::NamespaceMode::Container as i32,
                        ipc: pb::NamespaceMode::Pod as i32,
                        target_id: String::new(),
                    }),
                }),
            }),
            ..Default::default()
        }
    }

    /// The pod's sandbox (made now unless one is ready already): its id and IP.
    pub async fn sandbox(&self, pod: &Pod) -> Result<(String, String)> {
        let uid = meta::uid(&pod.metadata);
        let mut rt = self.runtime.clone();
        let existing = rt
            .list_pod_sandbox(pb::ListPodSandboxRequest {
                filter: Some(pb::PodSandboxFilter {
                    label_selector: [(POD_UID.to_string(), uid.to_string())].into(),
                    state: Some(pb::PodSandboxStateValue {
                        state: pb::PodSandboxState::SandboxReady as i32,
                    }),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .items;
        let id = match existing.into_iter().next() {
            Some(sb) => sb.id,
            None => {
                rt.run_pod_sandbox(pb::RunPodSandboxRequest {
                    config: Some(self.sandbox_config(pod)),
                    runtime_handler: String::new(),
                })
                .await
                .map_err(|e| anyhow!("creating the pod sandbox: {}", e.message()))?
                .into_inner()
                .pod_sandbox_id
            }
        };
        let status = rt
            .pod_sandbox_status(pb::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status;
        let ip = status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        Ok((id, ip))
    }

    /// The image's id when it is on the node.
    pub async fn image_id(&self, image: &str) -> Result<Option<String>> {
        let have = self
            .images
            .clone()
            .image_status(pb::ImageStatusRequest {
                image: Some(pb::ImageSpec {
                    image: image.to_string(),
                }),
                verbose: false,
            })
            .await
            .map_err(|e| anyhow!("{}", e.message()))?
            .into_inner()
            .image;
        Ok(have.map(|img| img.id))
    }

    /// Pulls the image; the error is the runtime's.
    pub async fn pull_image(&self, image: &str) -> Result<String> {
        let pulled = self
            .images
            .clone()
            .pull_image(pb::PullImageRequest {
                image: Some(pb::ImageSpec {
                    image: image.to_string(),
                }),
                sandbox_config: None,
            })
            .await
            .map_err(|e| anyhow!("{}", e.message()))?;
        Ok(pulled.into_inner().image_ref)
    }

    /// What the runtime says of itself, as the kubelet words it for the Node's Ready
    /// condition: `Ok(())` when RuntimeReady and NetworkReady are both true, otherwise the
    /// sentence naming the first that is not (or the error of a runtime that does not answer).
    pub async fn readiness(&self) -> Result<(), String> {
        let status = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            self.runtime
                .clone()
                .status(pb::StatusRequest { verbose: false }),
        )
        .await
        .map_err(|_| "container runtime is down: the runtime did not answer within 5s".to_string())?
        .map_err(|e| format!("container runtime is down: {}", e.message()))?
        .into_inner();
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        for (kind, what) in [
            ("RuntimeReady", "container runtime not ready"),
            ("NetworkReady", "container runtime network not ready"),
        ] {
            match conditions.iter().find(|c| c.r#type == kind) {
                Some(c) if c.status => {}
                Some(c) => {
                    return Err(format!(
                        "{what}: {kind}=false reason:{} message:{}",
                        c.reason, c.message
                    ))
                }
                None => return Err(format!("{what}: the runtime reports no {kind} condition")),
            }
        }
        Ok(())
    }

    /// Creates and starts one container of the pod (attempt `attempt`).
    pub async fn start_container(
        &self,
        pod: &Pod,
        sandbox: &str,
        container: &Container,
        attempt: u32,
        envs: Vec<pb::KeyValue>,
        mounts: Vec<pb::Mount>,
    ) -> Result<String> {
        let name = container.name.as_str();
        let config = pb::ContainerConfig {
            metadata: Some(pb::ContainerMetadata {
                name: name.to_string(),
                attempt,
            }),
            image: Some(pb::ImageSpec {
                image: container.image.clone().unwrap_or_default(),
            }),
            command: container.command.clone().unwrap_or_default(),
            args: container.args.clone().unwrap_or_default(),
            working_dir: container.working_dir.clone().unwrap_or_default(),
            envs,
            mounts,
            labels: [
                (POD_UID, meta::uid(&pod.metadata)),
                (POD_NAME, meta::name(&pod.metadata)),
                (POD_NAMESPACE, meta::namespace(&pod.metadata)),
                (CONTAINER_NAME, name),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            log_path: format!("{name}/{attempt}.log"),
            stdin: container.stdin.unwrap_or(false),
            stdin_once: container.stdin_once.unwrap_or(false),
            tty: container.tty.unwrap_or(false),
            linux: Some(pb::LinuxContainerConfig {
                resources: Some(linux_resources(container)),
            }),
            ..Default::default()
        };
        let mut rt = self.runtime.clone();
        let id = rt
            .create_container(pb::CreateContainerRequest {
                pod_sandbox_id: sandbox.to_string(),
                config: Some(config),
                sandbox_config: Some(self.sandbox_config(pod)),
            })
            .await
            .map_err(|e| anyhow!("creating container {name}: {}", e.message()))?
            .into_inner()
            .container_id;
        rt.start_container(pb::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|e| anyhow!("starting container {name}: {}", e.message()))?;
        Ok(id)
    }

    pub async fn container(&self, id: &str) -> Result<ContainerView> {
        let st = self
            .runtime
            .clone()
            .container_status(pb::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await?
            .into_inner()
            .status
            .ok_or_else(|| anyhow!("the runtime has no status for container {id}"))?;
        Ok(ContainerView {
            name: st.metadata.map(|m| m.name).unwrap_or_default(),
            id: st.id,
            image: st.image.map(|i| i.image).unwrap_or_default(),
            image_ref: st.image_ref,
            state: st.state,
            started_at: st.started_at,
            finished_at: st.finished_at,
            exit_code: st.exit_code,
            reason: st.reason,
        })
    }

    /// Runs a command in a container (exec probes): its exit code.
    pub async fn exec_sync(&self, id: &str, cmd: Vec<String>, timeout: i64) -> Result<i32> {
        let r = self
            .runtime
            .clone()
            .exec_sync(pb::ExecSyncRequest {
                container_id: id.to_string(),
                cmd,
                timeout,
            })
            .await
            .map_err(|e| anyhow!("{}", e.message()))?;
        Ok(r.into_inner().exit_code)
    }

    /// Stops one container: SIGTERM, then SIGKILL after `grace` seconds.
    pub async fn stop_container(&self, id: &str, grace: i64) -> Result<()> {
        self.runtime
            .clone()
            .stop_container(pb::StopContainerRequest {
                container_id: id.to_string(),
                timeout: grace,
            })
            .await
            .map_err(|e| anyhow!("stopping container {id}: {}", e.message()))?;
        Ok(())
    }

    /// Removes one (exited) container; a container already gone is not an error.
    pub async fn remove_container(&self, id: &str) -> Result<()> {
        match self
            .runtime
            .clone()
            .remove_container(pb::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
            Err(s) => Err(anyhow!("removing container {id}: {}", s.message())),
        }
    }

    /// The pod's containers the runtime holds (after an agent restart: to adopt them).
    pub async fn containers_of(&self, uid: &str) -> Result<Vec<pb::Container>> {
        Ok(self
            .runtime
            .clone()
            .list_containers(pb::ListContainersRequest {
                filter: Some(pb::ContainerFilter {
                    label_selector: [(POD_UID.to_string(), uid.to_string())].into(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .containers)
    }

    /// Stops every container of the pod (SIGTERM, then SIGKILL after `grace` seconds) and its
    /// sandbox, and removes them.
    pub async fn stop_pod(&self, uid: &str, grace: i64) -> Result<()> {
        let mut rt = self.runtime.clone();
        for c in self.containers_of(uid).await? {
            rt.stop_container(pb::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: grace,
            })
            .await?;
            rt.remove_container(pb::RemoveContainerRequest { container_id: c.id })
                .await?;
        }
        let sandboxes = rt
            .list_pod_sandbox(pb::ListPodSandboxRequest {
                filter: Some(pb::PodSandboxFilter {
                    label_selector: [(POD_UID.to_string(), uid.to_string())].into(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .items;
        for sb in sandboxes {
            rt.stop_pod_sandbox(pb::StopPodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await?;
            rt.remove_pod_sandbox(pb::RemovePodSandboxRequest {
                pod_sandbox_id: sb.id,
            })
            .await?;
        }
        Ok(())
    }

    /// The URL of the runtime's streaming server where `kubectl exec`, `attach` or
    /// `port-forward` on a running pod is served.
    pub async fn stream_url(&self, ns: &str, pod: &str, req: StreamRequest) -> Result<String> {
        let mut rt = self.runtime.clone();
        let sandbox = rt
            .list_pod_sandbox(pb::ListPodSandboxRequest {
                filter: Some(pb::PodSandboxFilter {
                    state: Some(pb::PodSandboxStateValue {
                        state: pb::PodSandboxState::SandboxReady as i32,
                    }),
                    label_selector: [
                        (POD_NAMESPACE.to_string(), ns.to_string()),
                        (POD_NAME.to_string(), pod.to_string()),
                    ]
                    .into(),
                    ..Default::default()
                }),
            })
            .await?
            .into_inner()
            .items
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("pod {pod:?} has no running sandbox on this node"))?
            .id;
        let running = |name: String| {
            let mut rt = rt.clone();
            let sandbox = sandbox.clone();
            async move {
                rt.list_containers(pb::ListContainersRequest {
                    filter: Some(pb::ContainerFilter {
                        state: Some(pb::ContainerStateValue {
                            state: pb::ContainerState::ContainerRunning as i32,
                        }),
                        pod_sandbox_id: sandbox,
                        label_selector: [(CONTAINER_NAME.to_string(), name.clone())].into(),
                        ..Default::default()
                    }),
                })
                .await?
                .into_inner()
                .containers
                .into_iter()
                .next()
                .map(|c| c.id)
                .ok_or_else(|| anyhow!("container not found ({name:?})"))
            }
        };
        let url = match req {
            StreamRequest::Exec {
                container,
                cmd,
                tty,
                stdin,
                stdout,
                stderr,
            } => {
                let container_id = running(container).await?;
                rt.exec(pb::ExecRequest {
                    container_id,
                    cmd,
                    tty,
                    stdin,
                    stdout,
                    stderr,
                })
                .await
                .map_err(|e| anyhow!("{}", e.message()))?
                .into_inner()
                .url
            }
            StreamRequest::Attach {
                container,
                tty,
                stdin,
                stdout,
                stderr,
            } => {
                let container_id = running(container).await?;
                rt.attach(pb::AttachRequest {
                    container_id,
                    stdin,
                    tty,
                    stdout,
                    stderr,
                })
                .await
                .map_err(|e| anyhow!("{}", e.message()))?
                .into_inner()
                .url
            }
            StreamRequest::PortForward { ports } => {
                rt.port_forward(pb::PortForwardRequest {
                    pod_sandbox_id: sandbox,
                    port: ports,
                })
                .await
                .map_err(|e| anyhow!("{}", e.message()))?
                .into_inner()
                .url
            }
        };
        Ok(url)
    }

    /// Uids of every pod the runtime holds a sandbox for.
    /// The resource usage of every container the runtime runs (CRI ListContainerStats).
    pub async fn container_stats(&self) -> Result<Vec<pb::ContainerStats>> {
        Ok(self
            .runtime
            .clone()
            .list_container_stats(pb::ListContainerStatsRequest { filter: None })
            .await?
            .into_inner()
            .stats)
    }

    pub async fn pod_uids(&self) -> Result<Vec<String>> {
        Ok(self
            .runtime
            .clone()
            .list_pod_sandbox(pb::ListPodSandboxRequest { filter: None })
            .await?
            .into_inner()
            .items
            .into_iter()
            .filter_map(|sb| sb.labels.get(POD_UID).cloned())
            .collect())
    }
}

/// The period of the CFS quota the kubelet uses (100 ms).
const CPU_PERIOD: i64 = 100_000;

/// A container's cgroup limits, as the kubelet derives them from its resources: CPU shares from
/// the CPU request (1024 per CPU, at least 2), a CFS quota from the CPU limit (at least 1 ms per
/// period), the memory limit in bytes. What is not set stays unlimited.
pub fn linux_resources(container: &Container) -> pb::LinuxContainerResources {
    let resources = container.resources.as_ref();
    let q = |limits: bool, name: &str| {
        resources
            .and_then(|r| (if limits { &r.limits } else { &r.requests }).as_ref())
            .and_then(|m| m.get(name))
            .and_then(|q| rkube_core::quantity::parse_quantity(&q.0))
    };
    // Nanos per milli-CPU: 1e6; per byte: 1e9.
    let milli = |n: i128| (n / 1_000_000) as i64;
    let request = q(false, "cpu").or(q(true, "cpu"));
    let mut r = pb::LinuxContainerResources {
        cpu_shares: request
            .map(|n| (milli(n) * 1024 / 1000).max(2))
            .unwrap_or(2),
        ..Default::default()
    };
    if let Some(limit) = q(true, "cpu") {
        r.cpu_period = CPU_PERIOD;
        r.cpu_quota = (milli(limit) * CPU_PERIOD / 1000).max(1000);
    }
    if let Some(mem) = q(true, "memory") {
        r.memory_limit_in_bytes = (mem / 1_000_000_000) as i64;
    }
    r
}

/// A streaming request on a pod: what the runtime is asked to serve.
#[derive(Debug, Clone)]
pub enum StreamRequest {
    Exec {
        container: String,
        cmd: Vec<String>,
        tty: bool,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    },
    Attach {
        container: String,
        tty: bool,
        stdin: bool,
        stdout: bool,
        stderr: bool,
    },
    PortForward {
        ports: Vec<i32>,
    },
}

/// The kubelet's restart back-off: 10 s, doubling, at most 5 minutes.
pub fn backoff(restarts: u32) -> Duration {
    let secs = 10u64.saturating_mul(1u64 << restarts.min(5));
    Duration::from_secs(secs.min(300))
}

/// The pod's hostname as the kubelet picks it: `spec.hostname` when set (an Indexed Job's
/// `<job>-<index>`), else the pod's name cut to 63 characters without a trailing `-` or `.`.
fn pod_hostname(pod: &Pod) -> String {
    match spec_str(pod, |s| s.hostname.as_ref()) {
        "" => {
            let cut: String = meta::name(&pod.metadata).chars().take(63).collect();
            cut.trim_end_matches(['-', '.']).to_string()
        }
        h => h.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_s_hostname_is_its_spec_s_or_its_name() {
        let pod = |name: &str, hostname: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name},
                "spec": {"hostname": hostname, "containers": []}}))
            .unwrap()
        };
        assert_eq!(pod_hostname(&pod("sum-1-x2b9z", "sum-1")), "sum-1");
        assert_eq!(pod_hostname(&pod("web-7d4", "")), "web-7d4");
        let long = format!("{}-abc", "a".repeat(62));
        assert_eq!(pod_hostname(&pod(&long, "")), "a".repeat(62));
    }

    fn container(mut spec: serde_json::Value) -> Container {
        spec["name"] = "c".into();
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn resources_become_cgroup_limits_as_the_kubelet_makes_them() {
        let c = serde_json::json!({"resources": {"requests": {"cpu": "250m"},
            "limits": {"cpu": "500m", "memory": "64Mi"}}});
        let r = linux_resources(&container(c));
        assert_eq!(
            (
                r.cpu_shares,
                r.cpu_period,
                r.cpu_quota,
                r.memory_limit_in_bytes
            ),
            (256, 100_000, 50_000, 64 << 20)
        );
        // A limit alone is also the request; nothing set: 2 shares, no quota, no limit.
        let r = linux_resources(&container(
            serde_json::json!({"resources": {"limits": {"cpu": "2"}}}),
        ));
        assert_eq!((r.cpu_shares, r.cpu_quota), (2048, 200_000));
        let r = linux_resources(&container(serde_json::json!({})));
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes),
            (2, 0, 0)
        );
    }

    #[test]
    fn back_off_doubles_from_ten_seconds_to_five_minutes() {
        let b: Vec<u64> = (0..7).map(|r| backoff(r).as_secs()).collect();
        assert_eq!(b, vec![10, 20, 40, 80, 160, 300, 300]);
    }
}
