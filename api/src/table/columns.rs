//! The columns kubectl's printers show for each kind.

use crate::resources::Resource;

pub(super) type Columns = &'static [(&'static str, &'static str, u8)];

/// The columns of a kind (name, type, priority), without the leading Name column when the
/// kind's printer does not start with it (events).
pub(super) fn columns(res: &Resource) -> Columns {
    if let Some(c) = (res.group == "batch")
        .then(|| super::batch::batch_columns(res.kind))
        .flatten()
    {
        return c;
    }
    match (res.group, res.kind) {
        ("autoscaling", "HorizontalPodAutoscaler") => super::autoscaling::COLUMNS,
        ("", "Pod") => &[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        ("apps", "Deployment") => &[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Up-to-date", "string", 0),
            ("Available", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => &[
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        ("apps", "DaemonSet") => &[
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Up-to-date", "integer", 0),
            ("Available", "integer", 0),
            ("Node Selector", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        ("apps", "StatefulSet") => &[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
        ],
        ("apps", "ControllerRevision") => &[
            ("Name", "string", 0),
            ("Controller", "string", 0),
            ("Revision", "integer", 0),
            ("Age", "string", 0),
        ],
        ("", "Service") => &[
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            ("Age", "string", 0),
            ("Selector", "string", 1),
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => &[
            ("Name", "string", 0),
            ("Age", "date", 0),
            ("SignerName", "string", 0),
            ("Requestor", "string", 0),
            ("RequestedDuration", "string", 0),
            ("Condition", "string", 0),
        ],
        ("", "Node") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        ("", "Namespace") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "ConfigMap") => &[
            ("Name", "string", 0),
            ("Data", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Secret") => &[
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Data", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "ServiceAccount") => &[
            ("Name", "string", 0),
            ("Secrets", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Endpoints") => &[
            ("Name", "string", 0),
            ("Endpoints", "string", 0),
            ("Age", "string", 0),
        ],
        ("discovery.k8s.io", "EndpointSlice") => &[
            ("Name", "string", 0),
            ("AddressType", "string", 0),
            ("Ports", "string", 0),
            ("Endpoints", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Event") | ("events.k8s.io", "Event") => &[
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        ("", "ResourceQuota") => &[
            ("Name", "string", 0),
            ("Age", "string", 0),
            ("Request", "string", 0),
            ("Limit", "string", 0),
        ],
        ("coordination.k8s.io", "Lease") => &[
            ("Name", "string", 0),
            ("Holder", "string", 0),
            ("Age", "string", 0),
        ],
        ("scheduling.k8s.io", "PriorityClass") => &[
            ("Name", "string", 0),
            ("Value", "integer", 0),
            ("Global-Default", "boolean", 0),
            ("Age", "string", 0),
            ("PreemptionPolicy", "string", 0),
        ],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => &[
            ("Name", "string", 0),
            ("Role", "string", 0),
            ("Age", "string", 0),
            ("Users", "string", 1),
            ("Groups", "string", 1),
            ("ServiceAccounts", "string", 1),
        ],
        ("", "PodTemplate") => &[
            ("Name", "string", 0),
            ("Containers", "string", 0),
            ("Images", "string", 0),
            ("Pod Labels", "string", 0),
        ],
        ("", "ComponentStatus") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Message", "string", 0),
            ("Error", "string", 0),
        ],
        ("networking.k8s.io", "Ingress") => &[
            ("Name", "string", 0),
            ("Class", "string", 0),
            ("Hosts", "string", 0),
            ("Address", "string", 0),
            ("Ports", "string", 0),
            ("Age", "string", 0),
        ],
        ("networking.k8s.io", "IngressClass") => &[
            ("Name", "string", 0),
            ("Controller", "string", 0),
            ("Parameters", "string", 0),
            ("Age", "string", 0),
        ],
        ("networking.k8s.io", "NetworkPolicy") => &[
            ("Name", "string", 0),
            ("Pod-Selector", "string", 0),
            ("Age", "string", 0),
        ],
        ("policy", "PodDisruptionBudget") => &[
            ("Name", "string", 0),
            ("Min Available", "string", 0),
            ("Max Unavailable", "string", 0),
            ("Allowed Disruptions", "integer", 0),
            ("Age", "string", 0),
        ],
        ("node.k8s.io", "RuntimeClass") => &[
            ("Name", "string", 0),
            ("Handler", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "PersistentVolume") => &[
            ("Name", "string", 0),
            ("Capacity", "string", 0),
            ("Access Modes", "string", 0),
            ("Reclaim Policy", "string", 0),
            ("Status", "string", 0),
            ("Claim", "string", 0),
            ("StorageClass", "string", 0),
            ("VolumeAttributesClass", "string", 0),
            ("Reason", "string", 0),
            ("Age", "string", 0),
            ("VolumeMode", "string", 1),
        ],
        ("", "PersistentVolumeClaim") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Volume", "string", 0),
            ("Capacity", "string", 0),
            ("Access Modes", "string", 0),
            ("StorageClass", "string", 0),
            ("VolumeAttributesClass", "string", 0),
            ("Age", "string", 0),
            ("VolumeMode", "string", 1),
        ],
        ("storage.k8s.io", "StorageClass") => &[
            ("Name", "string", 0),
            ("Provisioner", "string", 0),
            ("ReclaimPolicy", "string", 0),
            ("VolumeBindingMode", "string", 0),
            ("AllowVolumeExpansion", "string", 0),
            ("Age", "string", 0),
        ],
        ("storage.k8s.io", "CSIDriver") => &[
            ("Name", "string", 0),
            ("AttachRequired", "boolean", 0),
            ("PodInfoOnMount", "boolean", 0),
            ("StorageCapacity", "boolean", 0),
            ("TokenRequests", "string", 0),
            ("RequiresRepublish", "boolean", 0),
            ("Modes", "string", 0),
            ("Age", "string", 0),
        ],
        ("storage.k8s.io", "CSINode") => &[
            ("Name", "string", 0),
            ("Drivers", "integer", 0),
            ("Age", "string", 0),
        ],
        ("storage.k8s.io", "CSIStorageCapacity") => &[
            ("Name", "string", 0),
            ("StorageClassName", "string", 0),
            ("Capacity", "string", 0),
        ],
        ("storage.k8s.io", "VolumeAttachment") => &[
            ("Name", "string", 0),
            ("Attacher", "string", 0),
            ("PV", "string", 0),
            ("Node", "string", 0),
            ("Attached", "boolean", 0),
            ("Age", "string", 0),
        ],
        ("rbac.authorization.k8s.io", _) | ("", "LimitRange") => {
            &[("Name", "string", 0), ("Created At", "date", 0)]
        }
        _ => &[("Name", "string", 0), ("Age", "string", 0)],
    }
}
