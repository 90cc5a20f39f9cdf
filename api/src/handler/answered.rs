//! The stored-nowhere kinds besides the reviews: bindings, which assign the pod their name
//! names (pods/binding by the collection's path), component statuses, the health of the
//! control plane's parts worked out on each read, and resource metrics ([`super::metrics`]).

use serde_json::{json, Value};

use crate::auth::User;
use crate::error::ApiError;
use crate::query::Query;
use crate::resources;
use crate::storage::Fence;

use super::reads::Listed;
use super::{meta_str, Api, Target};

/// The parts `kubectl get componentstatuses` lists. The scheduler and the controllers run on
/// whichever member leads the store, so all three stand or fall with a leader.
const COMPONENTS: &[&str] = &["scheduler", "controller-manager", "etcd-0"];

/// The warnings a read of an answered kind carries: kube-apiserver's deprecation of
/// ComponentStatus, which kubectl prints.
pub(super) fn warnings(t: &Target) -> Vec<String> {
    match t.res.kind {
        "ComponentStatus" => vec!["v1 ComponentStatus is deprecated in v1.19+".to_string()],
        _ => Vec::new(),
    }
}

fn component_status(name: &str, healthy: bool) -> Value {
    let condition = if healthy {
        json!({"type": "Healthy", "status": "True", "message": "ok"})
    } else {
        json!({"type": "Healthy", "status": "False",
               "error": "the store has no leader; the control plane is not serving writes"})
    };
    json!({
        "kind": "ComponentStatus",
        "apiVersion": "v1",
        "metadata": {"name": name},
        "conditions": [condition],
    })
}

impl Api {
    /// A create of an answered kind: a review's answer, or a Binding's pod bound.
    pub(super) async fn answer_create(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        object: Value,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        if t.res.kind != "Binding" {
            return self.review(user, t, object).await;
        }
        let name = meta_str(&object, "name").unwrap_or("").to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                "",
                "Binding",
                "",
                vec![crate::error::Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ));
        }
        let pods = resources::find("", "v1", "pods")
            .ok_or_else(|| ApiError::internal("pods are served"))?;
        let mut pod = Target::new(pods, t.ns.clone(), Some(name));
        pod.sub = Some("binding".into());
        self.bind(&pod, q, object, fence).await
    }

    /// The objects of an answered kind that can be read (component statuses, resource
    /// metrics).
    pub(super) async fn answered_list(&self, t: &Target, q: &Query) -> Result<Listed, ApiError> {
        let mut listed = self.answered_items(t, q).await?;
        listed.items.iter_mut().for_each(crate::order::normalise);
        Ok(listed)
    }

    /// The objects of an answered kind, as they are made.
    async fn answered_items(&self, t: &Target, q: &Query) -> Result<Listed, ApiError> {
        if t.res.group == "metrics.k8s.io" {
            return self.metrics_list(t, q).await;
        }
        if t.res.kind != "ComponentStatus" {
            return Err(ApiError::method_not_allowed(format!(
                "{} are answered, not listed",
                t.res.qualified()
            )));
        }
        let healthy = self.node.leader().is_some();
        Ok(Listed {
            items: COMPONENTS
                .iter()
                .map(|c| component_status(c, healthy))
                .collect(),
            meta: json!({}),
        })
    }

    /// One object of an answered kind that can be read.
    pub(super) async fn answered_get(&self, t: &Target) -> Result<Value, ApiError> {
        if t.res.group == "metrics.k8s.io" {
            let mut object = self.metrics_get(t).await?;
            crate::order::normalise(&mut object);
            return Ok(object);
        }
        self.answered_list(t, &Query::default())
            .await?
            .items
            .into_iter()
            .find(|o| meta_str(o, "name") == Some(t.name()))
            .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, t.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_status_follows_the_leader() {
        let up = component_status("etcd-0", true);
        assert_eq!(up["conditions"][0]["status"], "True");
        assert_eq!(up["conditions"][0]["message"], "ok");
        let down = component_status("scheduler", false);
        assert_eq!(down["conditions"][0]["status"], "False");
        assert!(down["conditions"][0]["error"].is_string());
    }
}
