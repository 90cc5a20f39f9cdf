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
//!
//! `gather.rs` asks the members and builds the [`Report`] (`report.rs`, also the JSON);
//! `render.rs` draws it as HTML, with `chart.rs` for the charts and `format.rs` for numbers and
//! times; this file holds the handle and its routes.

mod chart;
mod format;
mod gather;
mod render;
mod report;
#[cfg(test)]
mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tonic::transport::{Channel, ClientTlsConfig};

use super::node::Node;
use crate::raft::NodeId;

pub use render::render;
pub use report::{
    MemberRow, MemberStatus, NodeCondition, NodeSource, NodeSummary, Nodes, Report, Role,
};

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
