//! What the API server keeps true on its own while its member leads: the namespaces that exist
//! from the start, a `default` ServiceAccount in every namespace, the `kubernetes` Service and
//! its Endpoints (an address per member), the end of a namespace's
//! deletion (its contents go, then the namespace), the default RBAC policy, and the rules of
//! aggregated ClusterRoles.
//!
//! # Correctness
//! Runs only on the Raft leader, and every write is a conditional store transaction, so two
//! members that both believe they lead for a moment cannot create anything twice.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::handler::{Api, Target};
use crate::query::Query;
use crate::resources::{self, RESOURCES};
use crate::storage::{Fence, Freshness};

pub const SYSTEM_NAMESPACES: &[&str] =
    &["default", "kube-system", "kube-public", "kube-node-lease"];

impl Api {
    pub fn start_background(self: Arc<Self>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut ticks: u64 = 0;
            let mut policy_done = false;
            let mut members = MemberLeases::default();
            loop {
                tick.tick().await;
                if !self.node.is_leader() {
                    // A later term watches the members' Leases afresh.
                    members = MemberLeases::default();
                    continue;
                }
                if let Err(e) = self.reconcile_namespaces().await {
                    tracing::debug!(error = %e, "namespace upkeep failed; retrying");
                }
                if let Err(e) = self.ensure_kubernetes_service().await {
                    tracing::debug!(error = %e, "creating the kubernetes Service failed; retrying");
                }
                if let Err(e) = self.reconcile_kubernetes_endpoints(&mut members).await {
                    tracing::debug!(error = %e, "the kubernetes Service's endpoints upkeep failed; retrying");
                }
                if let Err(e) = self.ensure_dns_service().await {
                    tracing::debug!(error = %e, "creating the kube-dns Service failed; retrying");
                }
                // Every tick until it has worked once, then now and then.
                if !policy_done || ticks.is_multiple_of(20) {
                    match self.ensure_default_policy().await {
                        Ok(()) => policy_done = true,
                        Err(e) => {
                            tracing::debug!(error = %e, "creating the default RBAC policy failed; retrying")
                        }
                    }
                }
                if let Err(e) = self.aggregate_cluster_roles().await {
                    tracing::debug!(error = %e, "ClusterRole aggregation failed; retrying");
                }
                ticks += 1;
                if ticks.is_multiple_of(20) {
                    if let Err(e) = self.reconcile_quotas().await {
                        tracing::debug!(error = %e, "quota upkeep failed; retrying");
                    }
                }
            }
        });
    }

    pub(crate) async fn create_if_missing(
        &self,
        target: Target,
        object: Value,
    ) -> Result<(), crate::error::ApiError> {
        match self
            .create_object(&target, &Query::default(), object, Fence::Any)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a Service the cluster needs unless one of that name exists (an operator's
    /// edits to it stay).
    async fn ensure_service(
        &self,
        namespace: &str,
        name: &str,
        object: Value,
    ) -> Result<(), crate::error::ApiError> {
        let svc = resources::find("", "v1", "services").expect("served");
        if self
            .store
            .get(&svc.key(Some(namespace), name), Freshness::Any)
            .await?
            .is_some()
        {
            return Ok(());
        }
        self.create_if_missing(Target::new(svc, Some(namespace.into()), None), object)
            .await
    }

    async fn reconcile_namespaces(&self) -> Result<(), crate::error::ApiError> {
        let nsres = resources::find("", "v1", "namespaces").expect("namespaces are served");
        let sares =
            resources::find("", "v1", "serviceaccounts").expect("serviceaccounts are served");
        for ns in SYSTEM_NAMESPACES {
            if self
                .store
                .get(&nsres.key(None, ns), Freshness::Any)
                .await?
                .is_none()
            {
                self.create_if_missing(
                    Target::new(nsres, None, None),
                    json!({"metadata": {"name": ns}}),
                )
                .await?;
            }
        }
        let prefix = nsres.prefix(None);
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        for kv in kvs {
            let ns = crate::storage::decode(&kv)?;
            let name = ns
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if ns.object.pointer("/metadata/deletionTimestamp").is_some() {
                self.finish_namespace(&name, &ns).await?;
            } else if self
                .store
                .get(&sares.key(Some(&name), "default"), Freshness::Any)
                .await?
                .is_none()
            {
                self.create_if_missing(
                    Target::new(sares, Some(name.clone()), None),
                    json!({"metadata": {"name": "default", "namespace": name}}),
                )
                .await?;
            }
        }
        Ok(())
    }

    /// Deletes everything in a terminating namespace (through the delete verb, so Service
    /// addresses and quota usage are released and finalizers honoured), then the namespace.
    async fn finish_namespace(
        &self,
        name: &str,
        ns: &crate::storage::Stored,
    ) -> Result<(), crate::error::ApiError> {
        let mut left = 0;
        let mut seen = std::collections::HashSet::new();
        for res in RESOURCES
            .iter()
            .filter(|r| r.namespaced && !r.storage.is_empty())
        {
            if !seen.insert(res.storage) {
                continue;
            }
            let prefix = res.prefix(Some(name));
            let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
            let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
            for kv in kvs {
                let obj = crate::storage::decode(&kv)?;
                left += 1;
                if obj.object.pointer("/metadata/deletionTimestamp").is_some() {
                    // Already marked; the owners of its finalizers finish it.
                    continue;
                }
                let oname = obj
                    .object
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let t = Target::new(res, Some(name.to_string()), Some(oname));
                match self
                    .delete_object(&t, &Query::default(), None, Fence::Any)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if left == 0 {
            let key = resources::find("", "v1", "namespaces")
                .expect("served")
                .key(None, name);
            self.store.delete_if(&key, ns.revision, Fence::Any).await?;
        }
        Ok(())
    }

    /// The `kubernetes` Service in default, on the first address of the service range.
    async fn ensure_kubernetes_service(&self) -> Result<(), crate::error::ApiError> {
        self.ensure_service(
            "default",
            "kubernetes",
            json!({
                "metadata": {"name": "kubernetes", "namespace": "default",
                             "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"type": "ClusterIP", "clusterIP": self.net.first().to_string(),
                         "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": self.port}]},
            }),
        )
        .await
    }

    /// The `kubernetes` Service's core Endpoints, as kube-apiserver's lease reconciler keeps
    /// them: an address per member serving the API, from the EndpointSlices the members publish
    /// for themselves ([`crate::dns::publish_member`]). The slices (the DNS ones too) of members
    /// whose Lease has not been renewed for [`crate::dns::MEMBER_LEASE_SECONDS`] (as this leader
    /// saw it: no clock is compared) or that have left the cluster are deleted first, so the
    /// Services stop sending pods to them; a member that comes back publishes them again.
    async fn reconcile_kubernetes_endpoints(
        &self,
        leases: &mut MemberLeases,
    ) -> Result<(), crate::error::ApiError> {
        let slices = resources::find("discovery.k8s.io", "v1", "endpointslices").expect("served");
        let endpoints = resources::find("", "v1", "endpoints").expect("served");
        // Member names, when every member has published its own (a joining one publishes it
        // as it starts).
        let members: Option<std::collections::BTreeSet<String>> =
            rkube_store::server::etcd::cluster::member_list(&self.node)
                .ok()
                .map(|ms| ms.into_iter().map(|m| m.name).collect())
                .filter(|names: &std::collections::BTreeSet<String>| !names.contains(""));
        let lease_res = resources::find("coordination.k8s.io", "v1", "leases").expect("served");
        let prefix = lease_res.prefix(Some("kube-system"));
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        let mut seen = Vec::new();
        for kv in kvs {
            let lease = crate::storage::decode(&kv)?;
            let name = lease
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            if let Some(member) = name.strip_prefix(crate::dns::MEMBER_LEASE_PREFIX) {
                seen.push((member.to_string(), lease.revision));
            }
        }
        let now = std::time::Instant::now();
        leases.observe(&seen, now);
        let mut by_port: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
        for ns in ["default", "kube-system"] {
            let prefix = slices.prefix(Some(ns));
            let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
            let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
            for kv in kvs {
                let slice = crate::storage::decode(&kv)?.object;
                let labels = slice.pointer("/metadata/labels");
                let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
                if label("endpointslice.kubernetes.io/managed-by")
                    != Some(crate::dns::MEMBER_MANAGER)
                {
                    continue;
                }
                let service = label("kubernetes.io/service-name").unwrap_or("");
                let name = slice
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let member = name.strip_prefix(&format!("{service}-")).unwrap_or("");
                let gone = members.as_ref().is_some_and(|m| !m.contains(member));
                if gone || !leases.alive(member, now) {
                    let t = Target::new(slices, Some(ns.to_string()), Some(name.to_string()));
                    match self
                        .delete_object(&t, &Query::default(), None, Fence::Any)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                    continue;
                }
                if (ns, service) != ("default", "kubernetes") {
                    continue;
                }
                let port = slice
                    .pointer("/ports/0/port")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                for ep in slice
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(ip) = ep.pointer("/addresses/0").and_then(Value::as_str) {
                        by_port.entry(port).or_default().push(ip.to_string());
                    }
                }
            }
        }
        let subsets: Vec<Value> = by_port
            .into_iter()
            .map(|(port, mut ips)| {
                ips.sort();
                ips.dedup();
                json!({"addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                       "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
            })
            .collect();
        let key = endpoints.key(Some("default"), "kubernetes");
        match self.store.get(&key, Freshness::Latest).await? {
            None if subsets.is_empty() => Ok(()),
            None => {
                self.create_if_missing(
                    Target::new(endpoints, Some("default".into()), None),
                    json!({"metadata": {"name": "kubernetes", "namespace": "default",
                                        "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                           "subsets": subsets}),
                )
                .await
            }
            Some(current) => {
                let wanted = (!subsets.is_empty()).then_some(Value::Array(subsets));
                if current.object.get("subsets") == wanted.as_ref() {
                    return Ok(());
                }
                let mut updated = current.object.clone();
                match wanted {
                    Some(w) => updated["subsets"] = w,
                    None => {
                        if let Some(o) = updated.as_object_mut() {
                            o.shift_remove("subsets");
                        }
                    }
                }
                self.store
                    .put_if(&key, &updated, current.revision, Fence::Any)
                    .await?;
                Ok(())
            }
        }
    }

    /// The cluster DNS Service, `kube-system/kube-dns`, on the tenth address of the service
    /// range (what pods' resolv.conf names). It has no selector: every member serving DNS
    /// publishes its own EndpointSlice for it.
    async fn ensure_dns_service(&self) -> Result<(), crate::error::ApiError> {
        self.ensure_service(
            "kube-system",
            "kube-dns",
            json!({
                "metadata": {"name": "kube-dns", "namespace": "kube-system",
                             "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
                "spec": {"type": "ClusterIP", "clusterIP": self.net.dns().to_string(),
                         "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                                   {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]},
            }),
        )
        .await
    }

    /// The default ClusterRoles and ClusterRoleBindings (cluster-admin for system:masters,
    /// admin/edit/view, discovery for every authenticated user...), created when missing. An
    /// operator's edits to them stay.
    async fn ensure_default_policy(&self) -> Result<(), crate::error::ApiError> {
        let roles = resources::find("rbac.authorization.k8s.io", "v1", "clusterroles")
            .expect("clusterroles are served");
        let bindings = resources::find("rbac.authorization.k8s.io", "v1", "clusterrolebindings")
            .expect("clusterrolebindings are served");
        let wanted = crate::rbac::policy::cluster_roles()
            .into_iter()
            .map(|o| (roles, o))
            .chain(
                crate::rbac::policy::cluster_role_bindings()
                    .into_iter()
                    .map(|o| (bindings, o)),
            );
        let namespaced = crate::rbac::policy::namespaced()
            .into_iter()
            .filter_map(|(plural, o)| {
                resources::find("rbac.authorization.k8s.io", "v1", plural).map(|r| (r, o))
            });
        for (res, object) in wanted.chain(namespaced) {
            let name = object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let ns = object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_string);
            if self
                .store
                .get(&res.key(ns.as_deref(), name), Freshness::Any)
                .await?
                .is_none()
            {
                self.create_if_missing(Target::new(res, ns, None), object)
                    .await?;
            }
        }
        Ok(())
    }

    /// Kubernetes' ClusterRole aggregation: a ClusterRole with an aggregationRule holds the
    /// rules of every ClusterRole its selectors match. The write compares the role's revision,
    /// so a concurrent edit is never overwritten; the next tick recomputes.
    async fn aggregate_cluster_roles(&self) -> Result<(), crate::error::ApiError> {
        let roles = resources::find("rbac.authorization.k8s.io", "v1", "clusterroles")
            .expect("clusterroles are served");
        for (name, rules) in self.authz.aggregations() {
            let key = roles.key(None, &name);
            let Some(current) = self.store.get(&key, Freshness::Latest).await? else {
                continue;
            };
            let mut updated = current.object.clone();
            crate::value::set(
                &mut updated,
                &["rules"],
                Value::Array(rules.iter().map(crate::rbac::Rule::to_json).collect()),
            );
            if updated != current.object {
                self.store
                    .put_if(&key, &updated, current.revision, Fence::Any)
                    .await?;
            }
        }
        Ok(())
    }

    /// Recomputes every quota's usage from the objects, at one revision, and stores it if it
    /// drifted (objects removed without the API, e.g. by a namespace's deletion racing a
    /// quota's creation). The write compares the quota's revision at that read, so it never
    /// overwrites a charge made since.
    async fn reconcile_quotas(&self) -> Result<(), crate::error::ApiError> {
        let qres = resources::find("", "v1", "resourcequotas").expect("served");
        let prefix = qres.prefix(None);
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        for kv in kvs {
            let q = crate::storage::decode(&kv)?;
            let ns = q
                .object
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let hard = q
                .object
                .pointer("/spec/hard")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let (status, rev) = self.quota_status(&ns, &hard, Freshness::Any).await?;
            // The quota as of that same revision.
            let key = String::from_utf8_lossy(&kv.key).to_string();
            let Some(at) = self.store.get(&key, Freshness::Exact(rev)).await? else {
                continue;
            };
            if at.object.get("status") != Some(&status) {
                let mut updated = at.object.clone();
                crate::value::set(&mut updated, &["status"], status);
                self.store
                    .put_if(&key, &updated, at.revision, Fence::Any)
                    .await?;
            }
        }
        Ok(())
    }
}

/// When this leader last saw each member's Lease change: a member whose Lease has not changed
/// for [`crate::dns::MEMBER_LEASE_SECONDS`] is down. Times are this member's own monotonic
/// clock, so members' clocks need not agree; a member is given that long from the moment this
/// leader first sees its Lease.
#[derive(Debug, Default)]
pub(crate) struct MemberLeases {
    seen: std::collections::HashMap<String, (i64, std::time::Instant)>,
}

impl MemberLeases {
    /// Takes in the members' Leases (member, revision) as they are now.
    pub(crate) fn observe(&mut self, leases: &[(String, i64)], now: std::time::Instant) {
        self.seen
            .retain(|member, _| leases.iter().any(|(m, _)| m == member));
        for (member, revision) in leases {
            match self.seen.get(member) {
                Some((r, _)) if r == revision => {}
                _ => {
                    self.seen.insert(member.clone(), (*revision, now));
                }
            }
        }
    }

    /// Whether the member's Lease changed recently enough.
    pub(crate) fn alive(&self, member: &str, now: std::time::Instant) -> bool {
        self.seen.get(member).is_some_and(|(_, at)| {
            now.duration_since(*at) < Duration::from_secs(crate::dns::MEMBER_LEASE_SECONDS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_is_down_once_its_lease_stops_changing() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = MemberLeases::default();
        m.observe(&[("n1".into(), 10), ("n2".into(), 11)], at(0));
        assert!(m.alive("n1", at(0)) && m.alive("n2", at(0)));
        assert!(!m.alive("n3", at(0)), "no Lease: not serving");
        // n1 renews, n2 does not.
        m.observe(&[("n1".into(), 20), ("n2".into(), 11)], at(10));
        m.observe(&[("n1".into(), 30), ("n2".into(), 11)], at(16));
        assert!(m.alive("n1", at(16)));
        assert!(!m.alive("n2", at(16)), "unchanged for 16 s");
        // n2 comes back; n1's Lease is deleted.
        m.observe(&[("n2".into(), 40)], at(17));
        assert!(m.alive("n2", at(17)));
        assert!(!m.alive("n1", at(17)));
    }
}
