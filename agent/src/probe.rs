//! Startup, liveness and readiness probes, as the kubelet runs them: httpGet (a status from 200
//! to 399), tcpSocket (a connection) and exec (exit code 0), each within `timeoutSeconds`, every
//! `periodSeconds` after `initialDelaySeconds`; `failureThreshold` failures in a row (and
//! `successThreshold` successes) flip the result. Ports are numbers or the names of the
//! container's ports. The same handlers (and `sleep`) run lifecycle hooks (preStop).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cri::Cri;

fn int(v: &Value, key: &str, default: i64) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or(default)
}

/// One probe of one container, and what it concluded so far.
pub struct Probe {
    spec: Value,
    /// The container's spec (its named ports).
    container: Value,
    next: Instant,
    successes: i64,
    failures: i64,
    /// The current verdict (readiness starts false, liveness true).
    pub ok: bool,
}

/// The outcome of one try: passed, or why not.
pub type Outcome = Result<(), String>;

impl Probe {
    pub fn new(spec: &Value, container: &Value, started: Instant, initially: bool) -> Probe {
        let delay = int(spec, "initialDelaySeconds", 0).max(0) as u64;
        Probe {
            spec: spec.clone(),
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
        let period = int(&self.spec, "periodSeconds", 10).max(1) as u64;
        self.next = now + Duration::from_secs(period);
        let timeout = Duration::from_secs(int(&self.spec, "timeoutSeconds", 1).max(1) as u64);
        let outcome = run(
            &self.spec,
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
            if self.successes >= int(&self.spec, "successThreshold", 1).max(1) {
                self.ok = true;
            }
        } else {
            self.successes = 0;
            self.failures += 1;
            if self.failures >= int(&self.spec, "failureThreshold", 3).max(1) {
                self.ok = false;
            }
        }
        Some(outcome)
    }

    /// Failed `failureThreshold` times in a row (a startup probe that gives up).
    pub fn exhausted(&self) -> bool {
        self.failures >= int(&self.spec, "failureThreshold", 3).max(1)
    }
}

/// A handler's port: a number, or the name of one of the container's ports.
fn port_of(handler: &Value, container: &Value) -> Result<u16, String> {
    match handler.get("port") {
        Some(Value::Number(n)) => n
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16)
            .ok_or_else(|| format!("invalid port {n}")),
        Some(Value::String(name)) => container
            .get("ports")
            .and_then(Value::as_array)
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|p| p.get("name").and_then(Value::as_str) == Some(name))
            })
            .and_then(|p| p.get("containerPort").and_then(Value::as_u64))
            .map(|p| p as u16)
            .or_else(|| name.parse().ok())
            .ok_or_else(|| format!("couldn't find port {name:?} in the container's ports")),
        _ => Err("the handler names no port".into()),
    }
}

/// Runs a probe's or a lifecycle hook's handler once.
pub async fn run(
    spec: &Value,
    container: &Value,
    cri: &Cri,
    id: &str,
    pod_ip: &str,
    timeout: Duration,
) -> Outcome {
    if let Some(h) = spec.get("sleep") {
        let secs = int(h, "seconds", 0).max(0) as u64;
        tokio::time::sleep(Duration::from_secs(secs).min(timeout)).await;
        return Ok(());
    }
    if let Some(h) = spec.get("httpGet") {
        let port = port_of(h, container)?;
        let path = h.get("path").and_then(Value::as_str).unwrap_or("/");
        let host = match h.get("host").and_then(Value::as_str) {
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
    if let Some(h) = spec.get("tcpSocket") {
        let port = port_of(h, container)?;
        return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect((pod_ip, port)))
            .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {pod_ip}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {pod_ip}:{port}: i/o timeout")),
        };
    }
    if let Some(h) = spec.get("exec") {
        let cmd: Vec<String> = h
            .get("command")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
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
        let c = serde_json::json!({"ports": [{"name": "http", "containerPort": 8080}]});
        assert_eq!(port_of(&serde_json::json!({"port": 81}), &c), Ok(81));
        assert_eq!(port_of(&serde_json::json!({"port": "http"}), &c), Ok(8080));
        assert!(port_of(&serde_json::json!({"port": "grpc"}), &c)
            .unwrap_err()
            .contains("couldn't find port"));
        assert!(port_of(&serde_json::json!({"port": 0}), &c).is_err());
    }
}
