//! Startup, liveness and readiness probes, as the kubelet runs them: httpGet (a status from 200
//! to 399), tcpSocket (a connection) and exec (exit code 0), each within `timeoutSeconds`, every
//! `periodSeconds` after `initialDelaySeconds`; `failureThreshold` failures in a row (and
//! `successThreshold` successes) flip the result. Ports are numbers or the names of the
//! container's ports. The same handlers (and `sleep`) run lifecycle hooks (preStop).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cri::Cri;

/// One probe of one container, and what it concluded so far.
pub struct Probe {
    spec: k8s_openapi::api::core::v1::Probe,
    /// The probe's action, in the shape a lifecycle hook has.
    handler: LifecycleHandler,
    /// The container's spec (its named ports).
    container: Container,
    next: Instant,
    successes: i32,
    failures: i32,
    /// The current verdict (readiness starts false, liveness true).
    pub ok: bool,
}

/// The outcome of one try: passed, or why not.
pub type Outcome = Result<(), String>;

impl Probe {
    pub fn new(
        spec: &k8s_openapi::api::core::v1::Probe,
        container: &Container,
        started: Instant,
        initially: bool,
    ) -> Probe {
        let delay = spec.initial_delay_seconds.unwrap_or(0).max(0) as u64;
        Probe {
            spec: spec.clone(),
            handler: LifecycleHandler {
                exec: spec.exec.clone(),
                http_get: spec.http_get.clone(),
                tcp_socket: spec.tcp_socket.clone(),
                sleep: None,
            },
            container: container.clone(),
            next: started + Duration::from_secs(delay),
            successes: 0,
            failures: 0,
            ok: initially,
        }
    }

    /// Runs the probe if it is due; Some(outcome) when it ran.
    pub async fn tick(&mut self, cri: &Cri, container_id: &str, pod_ip: &str) -> Option<Outcome> {
        let now = Instant::now();
        if now < self.next {
            return None;
        }
        let period = self.spec.period_seconds.unwrap_or(10).max(1) as u64;
        self.next = now + Duration::from_secs(period);
        let timeout = Duration::from_secs(self.spec.timeout_seconds.unwrap_or(1).max(1) as u64);
        let outcome = run(
            &self.handler,
            &self.container,
            cri,
            container_id,
            pod_ip,
            timeout,
        )
        .await;
        if outcome.is_ok() {
            self.failures = 0;
            self.successes += 1;
            if self.successes >= self.spec.success_threshold.unwrap_or(1).max(1) {
                self.ok = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.exhausted() {
                self.ok = false;
            }
        }
        Some(outcome)
    }

    /// Failed `failureThreshold` times in a row (a startup probe that gives up).
    pub fn exhausted(&self) -> bool {
        self.failures >= self.spec.failure_threshold.unwrap_or(3).max(1)
    }
}

/// A handler's port: a number, or the name of one of the container's ports.
fn port_of(port: &IntOrString, container: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("invalid port {n}")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_ref() == Some(name))
            .map(|p| p.container_port as u16)
            .or_else(|| name.parse().ok())
            .ok_or_else(|| format!("couldn't find port {name:?} in the container's ports")),
    }
}

/// Runs a probe's or a lifecycle hook's handler once.
pub async fn run(
    handler: &LifecycleHandler,
    container: &Container,
    cri: &Cri,
    id: &str,
    pod_ip: &str,
    timeout: Duration,
) -> Outcome {
    if let Some(h) = &handler.sleep {
        let secs = h.seconds.max(0) as u64;
        tokio::time::sleep(Duration::from_secs(secs).min(timeout)).await;
        return Ok(());
    }
    if let Some(h) = &handler.http_get {
        let port = port_of(&h.port, container)?;
        let path = h.path.as_deref().unwrap_or("/");
        let host = match h.host.as_deref() {
            Some(x) if !x.is_empty() => x.to_string(),
            _ => pod_ip.to_string(),
        };
        let attempt = async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.32\r\n\r\n").as_bytes())
                .await?;
            let mut buf = vec![0u8; 64];
            let n = s.read(&mut buf).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf[..n]).to_string())
        };
        let head = tokio::time::timeout(timeout, attempt)
            .await
            .map_err(|_| format!("Get \"http://{host}:{port}{path}\": context deadline exceeded"))?
            .map_err(|e| format!("Get \"http://{host}:{port}{path}\": {e}"))?;
        let code: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        return if (200..400).contains(&code) {
            Ok(())
        } else {
            Err(format!("HTTP probe failed with statuscode: {code}"))
        };
    }
    if let Some(h) = &handler.tcp_socket {
        let port = port_of(&h.port, container)?;
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((pod_ip, port)))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {pod_ip}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {pod_ip}:{port}: i/o timeout")),
        };
    }
    if let Some(h) = &handler.exec {
        let cmd = h.command.clone().unwrap_or_default();
        return match cri.exec_sync(id, cmd, timeout.as_secs() as i64).await {
            Ok(0) => Ok(()),
            Ok(code) => Err(format!("command exited with {code}")),
            Err(e) => Err(e.to_string()),
        };
    }
    Err("the handler names no action (httpGet, tcpSocket, exec or sleep)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_numbers_or_the_container_s_port_names() {
        let c: Container = serde_json::from_value(
            serde_json::json!({"name": "web", "ports": [{"name": "http", "containerPort": 8080}]}),
        )
        .unwrap();
        let cases: [(IntOrString, Result<u16, &str>); 5] = [
            (IntOrString::Int(81), Ok(81)),
            (IntOrString::String("http".into()), Ok(8080)),
            (IntOrString::String("82".into()), Ok(82)),
            (
                IntOrString::String("grpc".into()),
                Err("couldn't find port"),
            ),
            (IntOrString::Int(0), Err("invalid port 0")),
        ];
        for (port, want) in cases {
            match (port_of(&port, &c), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{port:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{port:?}: {got}"),
                (got, want) => panic!("{port:?}: {got:?}, want {want:?}"),
            }
        }
        assert!(port_of(&IntOrString::Int(70000), &c).is_err());
    }
}
