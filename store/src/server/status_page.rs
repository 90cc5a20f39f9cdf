//! The status page every member serves on its metrics port: `/` and `/status` (HTML), and
//! `/status.json` (the same report as JSON). Read-only, with the same access as `/metrics`
//! (plain HTTP, no authorization: bind `--listen-metrics` to a trusted address).
//!
//! The page shows the members (each one's own etcd `Status`, asked over the etcd API from this
//! member; a member that does not answer is shown as unreachable with when it last answered),
//! the Kubernetes nodes and their conditions (from the API layer through [`NodeSource`]; the
//! store knows no Kubernetes kinds), charts of the last hour and the leader changes and
//! snapshots of the last hours (`history.rs`). Everything is drawn on the server, the charts as
//! inline SVG: the page loads nothing else and works offline. A small inline script fetches the
//! page again every few seconds and swaps its content (a meta refresh without scripts).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::history::{Event, EventKind, Sample, SAMPLE_INTERVAL};
use super::node::Node;
use crate::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::proto::etcdserverpb::maintenance_server::Maintenance;
use crate::proto::etcdserverpb::{StatusRequest, StatusResponse};
use crate::raft::NodeId;

/// How long a member has to answer its Status.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the page's script fetches the page again.
const REFRESH_SECONDS: u64 = 5;

/// The nodes of the Kubernetes API this member serves, supplied by the API layer.
pub trait NodeSource: Send + Sync {
    #[allow(clippy::type_complexity)]
    fn nodes(&self) -> Pin<Box<dyn Future<Output = Result<Vec<NodeSummary>, String>> + Send + '_>>;
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    pub name: String,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    pub conditions: Vec<NodeCondition>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339, as the object has it.
    pub last_heartbeat_time: Option<String>,
}

impl NodeSummary {
    fn condition(&self, type_: &str) -> Option<&NodeCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// What the page shows of the nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum Nodes {
    /// This member serves no Kubernetes API (`--store-only`).
    NotServed,
    Listed {
        items: Vec<NodeSummary>,
    },
    Failed {
        error: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    Leader,
    Follower,
    Learner,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Learner => "learner",
        }
    }
}

/// A member's answer to etcd's `Status`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub revision: i64,
    pub db_size_bytes: i64,
    /// The leader as this member sees it (hex; empty: none).
    pub leader: String,
    /// Its errors and alarms, as `etcdctl endpoint status` shows them.
    pub errors: Vec<String>,
}

impl From<StatusResponse> for MemberStatus {
    fn from(s: StatusResponse) -> Self {
        Self {
            term: s.raft_term,
            commit_index: s.raft_index,
            applied_index: s.raft_applied_index,
            revision: s.header.map_or(0, |h| h.revision),
            db_size_bytes: s.db_size,
            leader: if s.leader == 0 {
                String::new()
            } else {
                format!("{:x}", s.leader)
            },
            errors: s.errors,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberRow {
    pub id: String,
    /// Empty until the member has published its name.
    pub name: String,
    pub peer_url: String,
    pub client_url: Option<String>,
    /// Its role as this member sees the cluster.
    pub role: Role,
    pub this_member: bool,
    /// None when it did not answer; then `error` says why.
    pub status: Option<MemberStatus>,
    pub error: Option<String>,
    /// Seconds since it last answered this member (none: never since this member started).
    pub last_contact_seconds: Option<f64>,
    /// The last log index the leader knows it holds (on the leader's page only).
    pub matched_index: Option<u64>,
}

impl MemberRow {
    fn label(&self) -> &str {
        if self.name.is_empty() {
            &self.id
        } else {
            &self.name
        }
    }
}

/// Everything the page shows; `/status.json` is this.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub member: String,
    pub member_id: String,
    pub cluster_id: String,
    #[serde(serialize_with = "rfc3339")]
    pub generated_at: DateTime<Utc>,
    pub term: u64,
    /// The leader as this member sees it (hex).
    pub leader: Option<String>,
    pub members: Vec<MemberRow>,
    pub nodes: Nodes,
    /// Leader changes and snapshots of the last hours, oldest first.
    pub events: Vec<Event>,
    /// One per `sampleIntervalSeconds` of the last hour, oldest first.
    pub samples: Vec<Sample>,
    pub sample_interval_seconds: u64,
}

fn rfc3339<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

/// The page's state: a handle, cloned into the HTTP handlers.
#[derive(Clone)]
pub struct StatusPage {
    inner: Arc<Inner>,
}

struct Inner {
    node: Arc<Node>,
    /// This member's client identity, for the other members' etcd ports.
    tls: ClientTlsConfig,
    channels: Mutex<HashMap<String, Channel>>,
    /// When each member last answered.
    contacts: Mutex<HashMap<NodeId, Instant>>,
    nodes: OnceLock<Arc<dyn NodeSource>>,
}

impl StatusPage {
    pub fn new(node: Arc<Node>, tls: ClientTlsConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                node,
                tls,
                channels: Mutex::default(),
                contacts: Mutex::default(),
                nodes: OnceLock::new(),
            }),
        }
    }

    /// Shows the nodes of the Kubernetes API this member serves (once; later calls are
    /// ignored).
    pub fn show_nodes(&self, source: Arc<dyn NodeSource>) {
        let _ = self.inner.nodes.set(source);
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/", get(html))
            .route("/status", get(html))
            .route("/status.json", get(json))
            .with_state(self.clone())
    }

    /// Asks the members for their status every sample interval until `stopped`, so that a
    /// member's last contact means something between page loads.
    pub async fn poll_members(self, stopped: impl Future<Output = ()>) {
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tick.tick() => {}
            }
            self.members().await;
        }
    }

    fn channel(&self, url: &str) -> Result<Channel, String> {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(url) {
            return Ok(c.clone());
        }
        let mut endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("bad client URL {url}: {e}"))?
            .connect_timeout(ASK_TIMEOUT)
            .tcp_nodelay(true);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(self.inner.tls.clone())
                .map_err(|e| format!("TLS for {url}: {e}"))?;
        }
        let channel = endpoint.connect_lazy();
        channels.insert(url.to_string(), channel.clone());
        Ok(channel)
    }

    /// A member's Status: this member's own by a function call, another's over its etcd port.
    async fn ask(&self, id: NodeId, url: Option<&str>) -> Result<StatusResponse, String> {
        let request = || {
            let mut r = tonic::Request::new(StatusRequest {});
            r.set_timeout(ASK_TIMEOUT);
            r
        };
        if id == self.inner.node.id {
            let service = super::etcd::maintenance::MaintenanceService(self.inner.node.clone());
            return service
                .status(request())
                .await
                .map(|r| r.into_inner())
                .map_err(|s| s.message().to_string());
        }
        let url = url.ok_or("it has not published its client URLs yet")?;
        let mut client = MaintenanceClient::new(self.channel(url)?);
        match tokio::time::timeout(
            ASK_TIMEOUT + Duration::from_secs(1),
            client.status(request()),
        )
        .await
        {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(explain(&s)),
            Err(_) => Err(format!(
                "no answer within {}",
                secs(ASK_TIMEOUT.as_secs_f64())
            )),
        }
    }

    /// Every member of the membership (by name), each asked for its status at the same time.
    async fn members(&self) -> Vec<MemberRow> {
        let node = &self.inner.node;
        let metrics = node.raft.metrics().borrow().clone();
        let attrs = node.mvcc.member_attrs().unwrap_or_default();
        let voters: Vec<NodeId> = metrics.membership_config.voter_ids().collect();
        let matched = metrics.replication.clone().unwrap_or_default();
        let members: Vec<(NodeId, String)> = metrics
            .membership_config
            .nodes()
            .map(|(id, m)| (*id, m.peer_addr.clone()))
            .collect();
        let answers = futures::future::join_all(members.iter().map(|(id, _)| {
            let url = attrs.get(id).and_then(|a| a.client_urls.first().cloned());
            async move { self.ask(*id, url.as_deref()).await }
        }))
        .await;
        let now = Instant::now();
        let mut contacts = self
            .inner
            .contacts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<MemberRow> = members
            .into_iter()
            .zip(answers)
            .map(|((id, peer), answer)| {
                if answer.is_ok() {
                    contacts.insert(id, now);
                }
                let a = attrs.get(&id);
                let role = if metrics.current_leader == Some(id) {
                    Role::Leader
                } else if voters.contains(&id) {
                    Role::Follower
                } else {
                    Role::Learner
                };
                let (status, error) = match answer {
                    Ok(s) => (Some(s.into()), None),
                    Err(e) => (None, Some(e)),
                };
                MemberRow {
                    id: format!("{id:x}"),
                    name: a.map(|a| a.name.clone()).unwrap_or_default(),
                    peer_url: format!("https://{peer}"),
                    client_url: a.and_then(|a| a.client_urls.first().cloned()),
                    role,
                    this_member: id == node.id,
                    status,
                    error,
                    last_contact_seconds: contacts
                        .get(&id)
                        .map(|at| now.duration_since(*at).as_secs_f64()),
                    matched_index: matched.get(&id).map(|m| m.map_or(0, |l| l.index)),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.label().cmp(b.label()));
        rows
    }

    pub async fn report(&self) -> Report {
        let node = &self.inner.node;
        let members = self.members().await;
        let nodes = match self.inner.nodes.get() {
            None => Nodes::NotServed,
            Some(source) => match source.nodes().await {
                Ok(items) => Nodes::Listed { items },
                Err(error) => Nodes::Failed { error },
            },
        };
        let metrics = node.raft.metrics().borrow().clone();
        Report {
            member: node.name.clone(),
            member_id: format!("{:x}", node.id),
            cluster_id: format!("{:x}", node.cluster_id),
            generated_at: Utc::now(),
            term: metrics.current_term,
            leader: metrics.current_leader.map(|l| format!("{l:x}")),
            members,
            nodes,
            events: node.metrics.history.events(),
            samples: node.metrics.history.samples(),
            sample_interval_seconds: SAMPLE_INTERVAL.as_secs(),
        }
    }
}

async fn html(State(page): State<StatusPage>) -> impl IntoResponse {
    let report = page.report().await;
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // Nothing but this page itself: no other origin, no external script or style.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'",
            ),
        ],
        render(&report),
    )
}

async fn json(State(page): State<StatusPage>) -> impl IntoResponse {
    let report = page.report().await;
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        serde_json::to_string_pretty(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
    )
}

/// A gRPC error as a sentence: its message and its root cause (a transport error's message
/// alone is "tcp connect error"; the cause says "Connection refused").
fn explain(status: &tonic::Status) -> String {
    let mut out = if status.message().is_empty() {
        format!("{:?}", status.code())
    } else {
        status.message().to_string()
    };
    let mut cause = None;
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        cause = Some(e.to_string());
        source = e.source();
    }
    if let Some(cause) = cause.filter(|c| !out.contains(c.as_str())) {
        out.push_str(": ");
        out.push_str(&cause);
    }
    out
}

// ---- rendering ----

/// Text for HTML content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn bytes(n: i64) -> String {
    let n = n.max(0) as f64;
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A short number: at most three significant digits, no trailing zeros.
fn num(v: f64) -> String {
    let a = v.abs();
    let s = if a == 0.0 {
        return "0".into();
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{} ms", (s * 1000.0).round())
    } else if s < 120.0 {
        format!("{:.0} s", s)
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

fn ago_secs(s: f64) -> String {
    if s < 1.0 {
        "just now".to_string()
    } else {
        format!("{} ago", secs(s))
    }
}

fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    ago_secs((now - at).num_milliseconds().max(0) as f64 / 1000.0)
}

fn clock(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if at.date_naive() == now.date_naive() {
        at.format("%H:%M:%S").to_string()
    } else {
        at.format("%Y-%m-%d %H:%M:%S").to_string()
    }
}

const STYLE: &str = r#"
:root{--fg:#1d2433;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;--ok:#12805c;--okbg:#e3f6ee;--bad:#b42318;--badbg:#fdecea;--warn:#a15c07;--warnbg:#fef4e4;--lead:#3b4cca;--leadbg:#e8ebfd}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 20px 40px}
header h1{font-size:22px;margin:0 0 2px}
header h1 small{font-weight:400;color:var(--muted);font-size:15px}
.sub{color:var(--muted);margin:0 0 16px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;margin:0 0 16px}
h2{font-size:15px;margin:0 0 10px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:500;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge,.nowrap{white-space:nowrap}
tr:last-child td{border-bottom:0}
tr.down td{color:var(--muted)}
.id{color:var(--muted);font-size:12px;font-family:ui-monospace,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600}
.leader{background:var(--leadbg);color:var(--lead)}
.follower,.learner,.muted{background:var(--line);color:var(--muted)}
.ok{background:var(--okbg);color:var(--ok)}
.bad{background:var(--badbg);color:var(--bad)}
.warnb{background:var(--warnbg);color:var(--warn)}
.tag{font-size:11px;color:var(--muted);margin-left:6px}
.err{color:var(--bad);font-size:12px}
.charts{display:grid;grid-template-columns:repeat(3,1fr);gap:14px}
figure{margin:0}
figcaption{font-weight:600;font-size:13px;margin-bottom:4px}
svg.chart{width:100%;height:auto;display:block}
.legend{font-size:12px;color:var(--muted);margin-top:2px}
.sw{display:inline-block;width:10px;height:3px;border-radius:2px;vertical-align:middle;margin-right:4px}
.legend span+span{margin-left:12px}
.note{color:var(--muted);margin:0}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;margin-right:6px;vertical-align:middle}
.banner{padding:8px 20px;font-weight:500}
.banner.error{background:var(--badbg);color:var(--bad)}
.banner.warn{background:var(--warnbg);color:var(--warn)}
footer{color:var(--muted);font-size:12px}
@media (max-width:900px){.charts{grid-template-columns:1fr}}
"#;

/// Fetches the page again every few seconds and swaps its content in (counting the swaps in
/// `body[data-refreshes]`); shows a banner when the member does not answer, and writes any
/// script error into the page.
const SCRIPT: &str = r#"
window.onerror = function (msg) {
  var e = document.getElementById('script-error');
  if (e) { e.hidden = false; e.textContent = 'Script error: ' + msg; }
};
(function () {
  var every = REFRESH_MS, refreshes = 0;
  function refresh() {
    fetch(location.pathname, { cache: 'no-store' })
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, 'text/html').getElementById('content');
        var old = document.getElementById('content');
        if (fresh && old) { old.replaceWith(fresh); }
        document.getElementById('stale').hidden = true;
        document.body.setAttribute('data-refreshes', String(++refreshes));
      })
      .catch(function (e) {
        var s = document.getElementById('stale');
        s.hidden = false;
        s.textContent = 'This member does not answer (' + e.message + '): the page shows what it said last.';
      })
      .then(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
"#;

pub fn render(r: &Report) -> String {
    let now = r.generated_at;
    let names: HashMap<&str, &str> = r
        .members
        .iter()
        .map(|m| (m.id.as_str(), m.label()))
        .collect();
    let name_of = |id: &str| {
        names
            .get(id)
            .map_or_else(|| id.to_string(), |n| n.to_string())
    };
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <link rel=\"icon\" href=\"data:,\"><title>rkube · {member}</title>\
         <noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\
         <style>{STYLE}</style></head><body>\
         <div id=\"script-error\" class=\"banner error\" hidden></div>\
         <div id=\"stale\" class=\"banner warn\" hidden></div>\
         <main id=\"content\" data-generated=\"{generated}\">",
        member = esc(&r.member),
        generated = esc(&now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    let leader = match &r.leader {
        Some(id) => format!(
            "leader <b id=\"leader\" data-leader=\"{}\">{}</b>",
            esc(id),
            esc(&name_of(id))
        ),
        None => "<b id=\"leader\" class=\"err\">no leader known</b>".to_string(),
    };
    let _ = write!(
        out,
        "<header><h1>rkube <small>member {member} · <span class=\"id\">{id}</span></small></h1>\
         <p class=\"sub\">cluster <span class=\"id\">{cluster}</span> · term {term} · {leader} · \
         as of {time} UTC</p></header>",
        member = esc(&r.member),
        id = esc(&r.member_id),
        cluster = esc(&r.cluster_id),
        term = r.term,
        time = now.format("%H:%M:%S"),
    );
    render_members(&mut out, r);
    render_charts(&mut out, r);
    render_nodes(&mut out, &r.nodes, now);
    render_events(&mut out, r, &name_of);
    let _ = write!(
        out,
        "<footer>Served by {member} on its metrics port, read-only; the same report as JSON at \
         <a href=\"/status.json\">/status.json</a>. The page refreshes every {REFRESH_SECONDS} s; \
         charts and events are this member's own memory since it started.</footer></main>\
         <script>{script}</script></body></html>",
        member = esc(&r.member),
        script = SCRIPT.replace("REFRESH_MS", &(REFRESH_SECONDS * 1000).to_string()),
    );
    out
}

fn render_members(out: &mut String, r: &Report) {
    let leader_page = r
        .members
        .iter()
        .any(|m| m.this_member && m.role == Role::Leader);
    let _ =
        write!(
        out,
        "<section id=\"members\"><h2>Members</h2><table><thead><tr><th>Member</th><th>Role</th>\
         <th>Term</th><th>Commit</th><th>Applied</th><th>Revision</th><th>DB size</th>\
         <th>Last contact</th>{}<th>Notes</th></tr></thead><tbody>",
        if leader_page { "<th>Replicated to</th>" } else { "" }
    );
    for m in &r.members {
        let reachable = m.status.is_some();
        let _ = write!(
            out,
            "<tr data-member=\"{name}\" data-id=\"{id}\" data-role=\"{role}\" \
             data-reachable=\"{reachable}\"{down}><td><b>{name}</b>{this}<br>\
             <span class=\"id\">{id} · {url}</span></td><td><span class=\"badge {role}\">{role}</span>",
            name = esc(m.label()),
            id = esc(&m.id),
            role = m.role.as_str(),
            down = if reachable { "" } else { " class=\"down\"" },
            this = if m.this_member {
                "<span class=\"tag\">this member</span>"
            } else {
                ""
            },
            url = esc(m.client_url.as_deref().unwrap_or(&m.peer_url)),
        );
        if !reachable {
            out.push_str(" <span class=\"badge bad\">unreachable</span>");
        }
        out.push_str("</td>");
        match &m.status {
            Some(s) => {
                let _ = write!(
                    out,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td>",
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    s.revision,
                    bytes(s.db_size_bytes)
                );
            }
            None => out.push_str(&"<td class=\"n\">—</td>".repeat(5)),
        }
        let contact = match (m.this_member, m.last_contact_seconds) {
            (true, _) => "—".to_string(),
            (false, Some(s)) => ago_secs(s),
            (false, None) => "never".to_string(),
        };
        let _ = write!(out, "<td class=\"nowrap\">{contact}</td>");
        if leader_page {
            let _ = match (m.this_member, m.matched_index) {
                (true, _) => write!(out, "<td class=\"n\">—</td>"),
                (false, Some(i)) => write!(out, "<td class=\"n\">{i}</td>"),
                (false, None) => write!(out, "<td class=\"n\">—</td>"),
            };
        }
        out.push_str("<td>");
        if let Some(e) = &m.error {
            let _ = write!(out, "<span class=\"err\">{}</span>", esc(e));
        }
        if let Some(s) = &m.status {
            for e in &s.errors {
                let _ = write!(out, "<span class=\"err\">{}</span><br>", esc(e));
            }
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table></section>");
}

/// One line of a chart: values by sample, `None` where there was nothing to measure.
struct Series<'a> {
    name: &'a str,
    color: &'a str,
    points: Vec<(DateTime<Utc>, Option<f64>)>,
}

fn render_charts(out: &mut String, r: &Report) {
    let s = &r.samples;
    let series = |name, color, f: &dyn Fn(&Sample) -> Option<f64>| Series {
        name,
        color,
        points: s.iter().map(|x| (x.at, f(x))).collect(),
    };
    let charts = [
        (
            "proposals",
            "Proposals per second",
            "/s",
            vec![
                series("proposals (as leader)", "#3b4cca", &|x| {
                    Some(x.proposals_per_second)
                }),
                series("entries committed", "#12a67a", &|x| {
                    Some(x.entries_per_second)
                }),
            ],
        ),
        (
            "commit",
            "Commit latency (proposal to apply)",
            "ms",
            vec![
                series("mean", "#3b4cca", &|x| x.commit.map(|l| l.mean_ms)),
                series("p99", "#e07a1f", &|x| x.commit.map(|l| l.p99_ms)),
            ],
        ),
        (
            "fsync",
            "WAL fsync latency",
            "ms",
            vec![
                series("mean", "#3b4cca", &|x| x.fsync.map(|l| l.mean_ms)),
                series("p99", "#e07a1f", &|x| x.fsync.map(|l| l.p99_ms)),
            ],
        ),
    ];
    let _ = write!(
        out,
        "<section id=\"charts\"><h2>Last hour <span class=\"tag\">a sample every {} s, {} so far</span></h2>\
         <div class=\"charts\">",
        r.sample_interval_seconds,
        s.len()
    );
    for (id, title, unit, series) in &charts {
        out.push_str(&chart(id, title, unit, r.generated_at, series));
    }
    out.push_str("</div></section>");
}

/// A line chart of the last hour as inline SVG.
fn chart(id: &str, title: &str, unit: &str, now: DateTime<Utc>, series: &[Series]) -> String {
    const W: f64 = 400.0;
    const H: f64 = 170.0;
    const LEFT: f64 = 44.0;
    const RIGHT: f64 = 8.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 22.0;
    const SPAN: f64 = 3600.0;
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .fold(0.0f64, f64::max);
    let top = nice_ceiling(max);
    let x = |at: DateTime<Utc>| {
        let before = (now - at).num_milliseconds() as f64 / 1000.0;
        LEFT + (W - LEFT - RIGHT) * (1.0 - before.clamp(0.0, SPAN) / SPAN)
    };
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - (v / top).clamp(0.0, 1.0));
    let points: usize = series
        .iter()
        .map(|s| s.points.iter().filter(|p| p.1.is_some()).count())
        .sum();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<figure><figcaption>{title}</figcaption><svg class=\"chart\" id=\"chart-{id}\" \
         data-points=\"{points}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{title}\" \
         xmlns=\"http://www.w3.org/2000/svg\" font-size=\"10\" fill=\"#667085\">",
        title = esc(title),
    );
    for i in 0..=4 {
        let v = top * i as f64 / 4.0;
        let yy = y(v);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{x2}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e7ec\"/>\
             <text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>",
            x2 = W - RIGHT,
            tx = LEFT - 4.0,
            ty = yy + 3.5,
            label = esc(&num(v)),
        );
    }
    for (minutes, anchor) in [
        (60, "start"),
        (45, "middle"),
        (30, "middle"),
        (15, "middle"),
        (0, "end"),
    ] {
        let at = now - chrono::Duration::minutes(minutes);
        let label = if minutes == 0 {
            "now".to_string()
        } else {
            format!("−{minutes} min")
        };
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\">{label}</text>",
            x(at),
            H - 6.0
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{TOP}\" dy=\"-1\" font-size=\"9\">{}</text>",
        esc(unit)
    );
    for s in series {
        // A gap where nothing was measured.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (at, v) in &s.points {
            match v {
                Some(v) => segments
                    .last_mut()
                    .map(|seg| seg.push((x(*at), y(*v))))
                    .unwrap_or(()),
                None if segments.last().is_some_and(|seg| !seg.is_empty()) => {
                    segments.push(Vec::new())
                }
                None => {}
            }
        }
        for seg in segments.iter().filter(|seg| !seg.is_empty()) {
            if seg.len() == 1 {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{}\"/>",
                    seg[0].0, seg[0].1, s.color
                );
            } else {
                let pts: Vec<String> = seg.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
                let _ = write!(
                    svg,
                    "<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" \
                     stroke-linejoin=\"round\" points=\"{}\"/>",
                    s.color,
                    pts.join(" ")
                );
            }
        }
    }
    if points == 0 {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">\
             no measurements yet</text>",
            (LEFT + W - RIGHT) / 2.0,
            (TOP + H - BOTTOM) / 2.0
        );
    }
    svg.push_str("</svg><div class=\"legend\">");
    for s in series {
        let last = s.points.iter().rev().find_map(|p| p.1);
        let _ = write!(
            svg,
            "<span><i class=\"sw\" style=\"background:{}\"></i>{} {}</span>",
            s.color,
            esc(s.name),
            last.map_or("—".to_string(), |v| format!("{} {}", num(v), esc(unit)))
        );
    }
    svg.push_str("</div></figure>");
    svg
}

/// The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for nothing).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 5.0, 10.0] {
        if step * magnitude >= v * (1.0 - 1e-9) {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

fn render_nodes(out: &mut String, nodes: &Nodes, now: DateTime<Utc>) {
    out.push_str("<section id=\"nodes\"><h2>Nodes</h2>");
    match nodes {
        Nodes::NotServed => out.push_str(
            "<p class=\"note\">This member serves no Kubernetes API (<code>--store-only</code>): \
             there are no nodes.</p>",
        ),
        Nodes::Failed { error } => {
            let _ = write!(
                out,
                "<p class=\"err\">The nodes could not be read: {}</p>",
                esc(error)
            );
        }
        Nodes::Listed { items } if items.is_empty() => out.push_str(
            "<p class=\"note\">No node has registered yet (start an agent: <code>rkube agent</code>).</p>",
        ),
        Nodes::Listed { items } => {
            out.push_str(
                "<table><thead><tr><th>Node</th><th>Ready</th><th>Conditions</th>\
                 <th>Last heartbeat</th></tr></thead><tbody>",
            );
            for n in items {
                let ready = n.condition("Ready");
                let status = ready.map_or("Unknown", |c| c.status.as_str());
                let class = match status {
                    "True" => "ok",
                    "False" => "bad",
                    _ => "warnb",
                };
                let label = match status {
                    "True" => "Ready",
                    "False" => "NotReady",
                    _ => "Unknown",
                };
                let _ = write!(
                    out,
                    "<tr data-node=\"{name}\" data-ready=\"{status}\"><td><b>{name}</b>{cordon}</td>\
                     <td><span class=\"badge {class}\">{label}</span>",
                    name = esc(&n.name),
                    status = esc(status),
                    cordon = if n.unschedulable {
                        " <span class=\"badge warnb\">SchedulingDisabled</span>"
                    } else {
                        ""
                    },
                );
                if let Some(c) = ready.filter(|c| c.status != "True" && !c.message.is_empty()) {
                    let _ = write!(out, "<br><span class=\"err\">{}</span>", esc(&c.message));
                }
                out.push_str("</td><td>");
                for c in &n.conditions {
                    // Ready is good when True, a pressure or unavailability condition when False.
                    let good = if c.type_ == "Ready" { "True" } else { "False" };
                    let class = match c.status.as_str() {
                        "True" | "False" if c.status == good => "ok",
                        "True" | "False" => "bad",
                        _ => "warnb",
                    };
                    let _ = write!(
                        out,
                        "<span class=\"badge {class}\" title=\"{title}\">{t}={s}</span> ",
                        t = esc(&c.type_),
                        s = esc(&c.status),
                        title = esc(&format!("{}: {}", c.reason, c.message)),
                    );
                }
                let heartbeat = n
                    .conditions
                    .iter()
                    .filter_map(|c| c.last_heartbeat_time.as_deref())
                    .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.with_timezone(&Utc))
                    .max();
                let _ = write!(
                    out,
                    "</td><td>{}</td></tr>",
                    heartbeat.map_or("—".to_string(), |t| ago(t, now))
                );
            }
            out.push_str("</tbody></table>");
        }
    }
    out.push_str("</section>");
}

fn render_events(out: &mut String, r: &Report, name_of: &dyn Fn(&str) -> String) {
    let now = r.generated_at;
    out.push_str("<section id=\"events\"><h2>Leader changes and snapshots</h2>");
    if r.events.is_empty() {
        out.push_str("<p class=\"note\">Nothing yet.</p></section>");
        return;
    }
    out.push_str("<table><thead><tr><th>When (UTC)</th><th></th><th>What</th></tr></thead><tbody>");
    for e in r.events.iter().rev() {
        let (kind, color, what) = match &e.kind {
            EventKind::Started { member } => (
                "started",
                "#667085",
                format!("{} started; its history begins here", esc(member)),
            ),
            EventKind::Leader { leader, term } => (
                "leader",
                "#3b4cca",
                format!(
                    "<b>{}</b> leads, term {term}",
                    esc(&name_of(&format!("{leader:x}")))
                ),
            ),
            EventKind::NoLeader { term } => (
                "no-leader",
                "#b42318",
                format!("no leader known (term {term}): an election, or this member is cut off"),
            ),
            EventKind::RaftSnapshotBuilt { index, term } => (
                "raft-snapshot",
                "#12a67a",
                format!("Raft snapshot built at log index {index} (term {term})"),
            ),
            EventKind::RaftSnapshotInstalled { index, term } => (
                "raft-snapshot-installed",
                "#e07a1f",
                format!(
                    "Raft snapshot installed from the leader at log index {index} (term {term}): \
                     this member was too far behind"
                ),
            ),
            EventKind::ScheduledSnapshot {
                file,
                revision,
                bytes: size,
            } => (
                "scheduled-snapshot",
                "#12a67a",
                format!(
                    "scheduled snapshot <code>{}</code> at revision {revision} ({})",
                    esc(file),
                    bytes(*size as i64)
                ),
            ),
            EventKind::ScheduledSnapshotFailed { error } => (
                "scheduled-snapshot-failed",
                "#b42318",
                format!("scheduled snapshot failed: {}", esc(error)),
            ),
        };
        let _ = write!(
            out,
            "<tr data-event=\"{kind}\"><td>{when}</td><td class=\"id\">{ago}</td>\
             <td><i class=\"dot\" style=\"background:{color}\"></i>{what}</td></tr>",
            when = clock(e.at, now),
            ago = ago(e.at, now),
        );
    }
    out.push_str("</tbody></table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::history::Latency;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("test time")
            .with_timezone(&Utc)
    }

    struct MemberBuilder(MemberRow);

    impl MemberBuilder {
        fn new(name: &str, id: u64) -> Self {
            Self(MemberRow {
                id: format!("{id:x}"),
                name: name.into(),
                peer_url: format!("https://127.0.0.1:{}", 2380 + id),
                client_url: Some(format!("https://127.0.0.1:{}", 2379 + id)),
                role: Role::Follower,
                this_member: false,
                status: Some(MemberStatus {
                    term: 3,
                    commit_index: 120,
                    applied_index: 119,
                    revision: 57,
                    db_size_bytes: 3 << 20,
                    leader: "1".into(),
                    errors: Vec::new(),
                }),
                error: None,
                last_contact_seconds: Some(4.0),
                matched_index: None,
            })
        }
        fn leader(mut self) -> Self {
            self.0.role = Role::Leader;
            self
        }
        fn this(mut self) -> Self {
            self.0.this_member = true;
            self
        }
        fn unreachable(mut self, error: &str) -> Self {
            self.0.status = None;
            self.0.error = Some(error.into());
            self
        }
        fn build(self) -> MemberRow {
            self.0
        }
    }

    fn report() -> Report {
        let now = at("2024-05-01T12:00:00Z");
        Report {
            member: "n1".into(),
            member_id: "1".into(),
            cluster_id: "c1".into(),
            generated_at: now,
            term: 3,
            leader: Some("1".into()),
            members: vec![
                MemberBuilder::new("n1", 1).leader().this().build(),
                MemberBuilder::new("n2", 2).build(),
                MemberBuilder::new("n3", 3)
                    .unreachable("transport error")
                    .build(),
            ],
            nodes: Nodes::Listed {
                items: vec![NodeSummary {
                    name: "agent1".into(),
                    unschedulable: false,
                    conditions: vec![
                        NodeCondition {
                            type_: "Ready".into(),
                            status: "True".into(),
                            reason: "KubeletReady".into(),
                            message: "kubelet is posting ready status".into(),
                            last_heartbeat_time: Some("2024-05-01T11:59:50Z".into()),
                        },
                        NodeCondition {
                            type_: "MemoryPressure".into(),
                            status: "False".into(),
                            reason: "KubeletHasSufficientMemory".into(),
                            message: String::new(),
                            last_heartbeat_time: Some("2024-05-01T11:59:50Z".into()),
                        },
                    ],
                }],
            },
            events: vec![
                Event {
                    at: at("2024-05-01T11:00:00Z"),
                    kind: EventKind::Leader { leader: 1, term: 3 },
                },
                Event {
                    at: at("2024-05-01T11:30:00Z"),
                    kind: EventKind::ScheduledSnapshot {
                        file: "rkube-snapshot-x.snap".into(),
                        revision: 50,
                        bytes: 2048,
                    },
                },
            ],
            samples: (0..30)
                .map(|i| Sample {
                    at: now - chrono::Duration::seconds(10 * (30 - i)),
                    proposals_per_second: i as f64,
                    entries_per_second: 1.0,
                    commit: (i % 10 != 5).then_some(Latency {
                        mean_ms: 2.0,
                        p99_ms: 8.0,
                    }),
                    fsync: Some(Latency {
                        mean_ms: 0.5,
                        p99_ms: 1.0,
                    }),
                })
                .collect(),
            sample_interval_seconds: 10,
        }
    }

    #[test]
    fn the_page_shows_members_roles_and_who_does_not_answer() {
        let html = render(&report());
        assert!(html.contains(
            "data-member=\"n1\" data-id=\"1\" data-role=\"leader\" data-reachable=\"true\""
        ));
        assert!(html.contains(
            "data-member=\"n3\" data-id=\"3\" data-role=\"follower\" data-reachable=\"false\""
        ));
        assert!(html.contains(">unreachable</span>"));
        assert!(html.contains("transport error"));
        assert!(html.contains("leader <b id=\"leader\" data-leader=\"1\">n1</b>"));
        assert!(html.contains("<th>Replicated to</th>"), "the leader's page");
        assert!(html.contains("3.0 MiB"));
    }

    #[test]
    fn the_page_shows_nodes_events_and_charts() {
        let html = render(&report());
        assert!(html.contains("data-node=\"agent1\" data-ready=\"True\""));
        assert!(html.contains("MemoryPressure=False"));
        assert!(html.contains("10 s ago"), "the node's heartbeat");
        assert!(html.contains("<b>n1</b> leads, term 3"));
        assert!(html.contains("rkube-snapshot-x.snap</code> at revision 50 (2.0 KiB)"));
        for id in ["proposals", "commit", "fsync"] {
            assert!(html.contains(&format!("id=\"chart-{id}\"")), "{id}");
        }
        // The commit latency has three gaps: four lines per series.
        let commit = html
            .split("id=\"chart-commit\"")
            .nth(1)
            .and_then(|s| s.split("</svg>").next())
            .expect("commit chart");
        assert_eq!(commit.matches("<polyline").count(), 8, "{commit}");
    }

    #[test]
    fn without_the_kubernetes_api_the_page_says_there_are_no_nodes() {
        let mut r = report();
        r.nodes = Nodes::NotServed;
        assert!(render(&r).contains("serves no Kubernetes API (<code>--store-only</code>)"));
        r.nodes = Nodes::Listed { items: vec![] };
        assert!(render(&r).contains("No node has registered yet"));
    }

    #[test]
    fn text_from_the_cluster_is_escaped() {
        let mut r = report();
        r.members[2].error = Some("<script>alert(1)</script>".into());
        r.nodes = Nodes::Failed {
            error: "a \"quoted\" & <b>".into(),
        };
        let html = render(&r);
        assert!(!html.contains("<script>alert"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("a &quot;quoted&quot; &amp; &lt;b&gt;"));
    }

    #[test]
    fn an_empty_history_draws_empty_charts() {
        let mut r = report();
        r.samples.clear();
        r.events.clear();
        let html = render(&r);
        assert_eq!(html.matches("no measurements yet").count(), 3);
        assert!(html.contains("data-points=\"0\""));
        assert!(html.contains("Nothing yet."));
    }

    #[test]
    fn numbers_read_short() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (0.25, "0.25"),
            (1.5, "1.5"),
            (12.34, "12.3"),
            (250.0, "250"),
        ];
        for (v, want) in cases {
            assert_eq!(num(*v), *want);
        }
        let ceilings: &[(f64, f64)] = &[
            (0.0, 1.0),
            (0.7, 1.0),
            (1.0, 1.0),
            (1.2, 2.0),
            (3.0, 5.0),
            (60.0, 100.0),
        ];
        for (v, want) in ceilings {
            assert_eq!(nice_ceiling(*v), *want, "{v}");
        }
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(secs(0.25), "250 ms");
        assert_eq!(secs(90.0), "90 s");
        assert_eq!(secs(600.0), "10 min");
    }

    #[test]
    fn the_report_serializes_as_json() {
        let json = serde_json::to_value(report()).expect("json");
        assert_eq!(json["members"][0]["role"], "leader");
        assert_eq!(json["members"][2]["status"], serde_json::Value::Null);
        assert_eq!(json["nodes"]["state"], "listed");
        assert_eq!(json["nodes"]["items"][0]["conditions"][0]["type"], "Ready");
        assert_eq!(json["events"][1]["kind"], "scheduledSnapshot");
        assert_eq!(json["samples"].as_array().map(Vec::len), Some(30));
        assert_eq!(json["generatedAt"], "2024-05-01T12:00:00.000Z");
    }
}
