//! The proxy's metrics.

/// What the proxy programs (or, on a simulated node, would program), as the agent's metrics.
#[derive(Debug, Default, Clone)]
pub struct ProxyMetrics {
    pub syncs: prometheus_client::metrics::counter::Counter,
    pub rules: prometheus_client::metrics::gauge::Gauge,
    pub service_ports: prometheus_client::metrics::gauge::Gauge,
    pub endpoints: prometheus_client::metrics::gauge::Gauge,
    pub programmed: prometheus_client::metrics::gauge::Gauge,
    pub last_sync_milliseconds: prometheus_client::metrics::gauge::Gauge,
}

impl ProxyMetrics {
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "rkube_proxy_syncs",
            "Rule syncs that changed the rule set",
            self.syncs.clone(),
        );
        r.register(
            "rkube_proxy_rules",
            "Rules in the node's rule set (rkube chains, nat and filter)",
            self.rules.clone(),
        );
        r.register(
            "rkube_proxy_service_ports",
            "Service ports with a virtual address",
            self.service_ports.clone(),
        );
        r.register(
            "rkube_proxy_endpoints",
            "Ready endpoints behind them",
            self.endpoints.clone(),
        );
        r.register("rkube_proxy_programmed", "1 when the rules are programmed into the node, 0 when only worked out (simulated nodes)", self.programmed.clone());
        r.register(
            "rkube_proxy_last_sync_milliseconds",
            "How long the last sync took",
            self.last_sync_milliseconds.clone(),
        );
    }
}
