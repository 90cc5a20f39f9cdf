//! Resource paths of the Kubernetes API, made from a k8s-openapi type's own constants
//! (`API_VERSION`, `URL_PATH_SEGMENT`), so no caller writes a URL by hand: `/api/v1/...` for the
//! core group, `/apis/<group>/<version>/...` for the others, `namespaces/<ns>/` before the
//! resource when it is namespaced.

use k8s_openapi::Resource;

/// The collection of `K` in `namespace` (`""`: cluster-scoped, or every namespace).
pub fn collection<K: Resource>(namespace: &str) -> String {
    let base = if K::GROUP.is_empty() { "/api" } else { "/apis" };
    if namespace.is_empty() {
        format!("{base}/{}/{}", K::API_VERSION, K::URL_PATH_SEGMENT)
    } else {
        format!(
            "{base}/{}/namespaces/{namespace}/{}",
            K::API_VERSION,
            K::URL_PATH_SEGMENT
        )
    }
}

/// The object `name` of `K` in `namespace` (`""` when cluster-scoped).
pub fn object<K: Resource>(namespace: &str, name: &str) -> String {
    format!("{}/{name}", collection::<K>(namespace))
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
    }
}
