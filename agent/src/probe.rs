//! Liveness and readiness probes, as the kubelet runs them: httpGet (a status from 200 to 399),
//! tcpSocket (a connection) and exec (exit code 0), each within `timeoutSeconds`, every
//! `periodSeconds` after `initialDelaySeconds`; `failureThreshold` failures in a row (and
//! `successThreshold` successes) flip the result.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cri::Cri;

fn int(v: &Value, key: &str, default: i64) -> i64 {
    v.get(key).and_then(Value::as_i64).unwrap_or(default)
}

/// One probe of one container, and what it concluded so far.
pub struct Probe {
    spec: Value,
    next: Instant,
    successes: i64,
    failures: i64,
    /// The current verdict (readiness starts false, liveness true).
    pub ok: bool,
}

/// The outcome of one try: passed, or why not.
pub type Outcome = Result<(), String>;

impl Probe {
    pub fn new(spec: &Value, started: Instant, initially: bool) -> Probe {
        let delay = int(spec, "initialDelaySeconds", 0).max(0) as u64;
        Probe {
            spec: spec.clone(),
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
        let outcome = run(&self.spec, cri, container_id, pod_ip, timeout).await;
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
}

fn port_of(handler: &Value) -> Option<u16> {
    handler
        .get("port")
        .and_then(Value::as_u64)
        .map(|p| p as u16)
}

async fn run(spec: &Value, cri: &Cri, id: &str, pod_ip: &str, timeout: Duration) -> Outcome {
    if let Some(h) = spec.get("httpGet") {
        let port = port_of(h).ok_or("httpGet probe: only numeric ports are supported")?;
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
        let port = port_of(h).ok_or("tcpSocket probe: only numeric ports are supported")?;
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
    Err("the probe names no handler (httpGet, tcpSocket or exec)".into())
}
