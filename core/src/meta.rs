//! Reading the metadata of typed objects: names, cache keys and owner references, as every
//! controller needs them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::{Metadata, Resource};

/// The object's name ("" when absent).
pub fn name(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

/// The object's namespace ("" when cluster-scoped).
pub fn namespace(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("")
}

/// The object's uid ("" before the API server gave it one).
pub fn uid(meta: &ObjectMeta) -> &str {
    meta.uid.as_deref().unwrap_or("")
}

/// The cache key of an object: `namespace/name`, or `name` when cluster-scoped (the informers'
/// keys).
pub fn key(meta: &ObjectMeta) -> String {
    match namespace(meta) {
        "" => name(meta).to_string(),
        ns => format!("{ns}/{}", name(meta)),
    }
}

/// The owner reference that names the object's controller, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// A controller owner reference to `owner` (blocking its deletion in the foreground until the
/// dependent is gone, as Kubernetes' controllers set it).
pub fn controller_ref<K: Resource + Metadata<Ty = ObjectMeta>>(owner: &K) -> OwnerReference {
    let meta = owner.metadata();
    OwnerReference {
        api_version: K::API_VERSION.to_string(),
        kind: K::KIND.to_string(),
        name: name(meta).to_string(),
        uid: meta.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSet;

    #[test]
    fn keys_and_controller_references() {
        let mut rs = ReplicaSet::default();
        rs.metadata.name = Some("web".into());
        assert_eq!(key(&rs.metadata), "web");
        rs.metadata.namespace = Some("ns".into());
        rs.metadata.uid = Some("u1".into());
        assert_eq!(key(&rs.metadata), "ns/web");
        let r = controller_ref(&rs);
        assert_eq!(
            (r.api_version.as_str(), r.kind.as_str(), r.uid.as_str()),
            ("apps/v1", "ReplicaSet", "u1")
        );
        let mut pod = ObjectMeta::default();
        assert!(controller_of(&pod).is_none());
        pod.owner_references = Some(vec![
            OwnerReference {
                name: "other".into(),
                ..Default::default()
            },
            r,
        ]);
        assert_eq!(controller_of(&pod).map(|r| r.name.as_str()), Some("web"));
    }
}
