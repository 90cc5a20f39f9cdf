//! Resource paths of the Kubernetes API, made from a k8s-openapi type's own constants
//! (`API_VERSION`, `URL_PATH_SEGMENT`), so no caller writes a URL by hand: `/api/v1/...` for the
//! core group, `/apis/<group>/<version>/...` for the others, `namespaces/<ns>/` before the
//! resource when it is namespaced.

use k8s_openapi::Resource;

/// The collection of `K` in `namespace` (`""`: cluster-scoped, or every namespace).
pub fn collection<K: Resource>(namespace: &str) -> String {
    collection_of(K::GROUP, K::API_VERSION, K::URL_PATH_SEGMENT, namespace)
}

/// The object `name` of `K` in `namespace` (`""` when cluster-scoped).
pub fn object<K: Resource>(namespace: &str, name: &str) -> String {
    format!("{}/{name}", collection::<K>(namespace))
}

/// The collection `plural` of `api_version` (`v1`, `apps/v1`) in `namespace`, for code that
/// knows a resource by name rather than by type (the garbage collector, which follows many).
pub fn collection_of(group: &str, api_version: &str, plural: &str, namespace: &str) -> String {
    let base = if group.is_empty() { "/api" } else { "/apis" };
    if namespace.is_empty() {
        format!("{base}/{api_version}/{plural}")
    } else {
        format!("{base}/{api_version}/namespaces/{namespace}/{plural}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use k8s_openapi::api::core::v1::{Node, Pod};

    #[test]
    fn paths_follow_the_group_and_the_scope() {
        assert_eq!(collection::<Pod>("ns"), "/api/v1/namespaces/ns/pods");
        assert_eq!(object::<Pod>("ns", "web"), "/api/v1/namespaces/ns/pods/web");
        assert_eq!(
            object::<ReplicaSet>("ns", "web"),
            "/apis/apps/v1/namespaces/ns/replicasets/web"
        );
        assert_eq!(object::<Node>("", "n1"), "/api/v1/nodes/n1");
        assert_eq!(
            collection_of("batch", "batch/v1", "jobs", "ns"),
            "/apis/batch/v1/namespaces/ns/jobs"
        );
    }
}
