//! The messages the decoder knows: for each, its fields' numbers, JSON names and types, as
//! Kubernetes' generated.proto defines them.

#[derive(Clone, Copy)]
pub(super) enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static str),
    /// map<string, string>
    MapStr,
    /// map<string, bytes> (base64 in JSON)
    MapBytes,
    /// map<string, Quantity>
    MapQuantity,
    Time,
    IntOrString,
    /// Read and dropped: the status of an object being created or replaced, which the server
    /// sets itself.
    Ignored,
    /// An embedded message whose fields JSON puts in the enclosing object (Go's `json:",inline"`:
    /// an IngressRule's http).
    Inline(&'static str),
}

pub(super) struct F {
    pub(super) num: u32,
    pub(super) name: &'static str,
    pub(super) ty: Ty,
    pub(super) repeated: bool,
    /// A pointer field in Kubernetes' Go types: present means set, even to zero. Other scalar
    /// fields are always on the wire, and their zero value means unset (omitted in JSON).
    pub(super) pointer: bool,
}

const fn f(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        pointer: false,
    }
}

const fn p(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        pointer: true,
    }
}

const fn r(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: true,
        pointer: false,
    }
}

use Ty::*;

/// Messages by name: (fields).
pub(super) static MESSAGES: &[(&str, &[F])] = &[
    (
        "ObjectMeta",
        &[
            f(1, "name", Str),
            f(2, "generateName", Str),
            f(3, "namespace", Str),
            f(4, "selfLink", Str),
            f(5, "uid", Str),
            f(6, "resourceVersion", Str),
            f(7, "generation", Int),
            f(8, "creationTimestamp", Time),
            f(9, "deletionTimestamp", Time),
            p(10, "deletionGracePeriodSeconds", Int),
            f(11, "labels", MapStr),
            f(12, "annotations", MapStr),
            r(13, "ownerReferences", Msg("OwnerReference")),
            r(14, "finalizers", Str),
        ],
    ),
    (
        "OwnerReference",
        &[
            f(1, "kind", Str),
            f(3, "name", Str),
            f(4, "uid", Str),
            f(5, "apiVersion", Str),
            p(6, "controller", Bool),
            p(7, "blockOwnerDeletion", Bool),
        ],
    ),
    (
        "LabelSelector",
        &[
            f(1, "matchLabels", MapStr),
            r(2, "matchExpressions", Msg("LabelSelectorRequirement")),
        ],
    ),
    (
        "LabelSelectorRequirement",
        &[f(1, "key", Str), f(2, "operator", Str), r(3, "values", Str)],
    ),
    (
        "Namespace",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("NamespaceSpec")),
            f(3, "status", Ignored),
        ],
    ),
    ("NamespaceSpec", &[r(1, "finalizers", Str)]),
    (
        "ConfigMap",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "data", MapStr),
            f(3, "binaryData", MapBytes),
            p(4, "immutable", Bool),
        ],
    ),
    (
        "Secret",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "data", MapBytes),
            f(3, "type", Str),
            f(4, "stringData", MapStr),
            p(5, "immutable", Bool),
        ],
    ),
    (
        "ServiceAccount",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            p(4, "automountServiceAccountToken", Bool),
        ],
    ),
    (
        "Service",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("ServiceSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "ServiceSpec",
        &[
            r(1, "ports", Msg("ServicePort")),
            f(2, "selector", MapStr),
            f(3, "clusterIP", Str),
            f(4, "type", Str),
            r(5, "externalIPs", Str),
            f(7, "sessionAffinity", Str),
            f(8, "loadBalancerIP", Str),
            r(9, "loadBalancerSourceRanges", Str),
            f(10, "externalName", Str),
            f(11, "externalTrafficPolicy", Str),
            f(12, "healthCheckNodePort", Int),
            f(13, "publishNotReadyAddresses", Bool),
            p(17, "ipFamilyPolicy", Str),
            r(18, "clusterIPs", Str),
            r(19, "ipFamilies", Str),
            p(20, "allocateLoadBalancerNodePorts", Bool),
            p(21, "loadBalancerClass", Str),
            p(22, "internalTrafficPolicy", Str),
        ],
    ),
    (
        "ServicePort",
        &[
            f(1, "name", Str),
            f(2, "protocol", Str),
            f(3, "port", Int),
            f(4, "targetPort", IntOrString),
            f(5, "nodePort", Int),
            p(6, "appProtocol", Str),
        ],
    ),
    (
        "Deployment",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("DeploymentSpec")),
            f(3, "status", Ignored),
        ],
    ),
    // autoscaling/v1, as `kubectl autoscale` sends it.
    (
        "HorizontalPodAutoscaler",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("HorizontalPodAutoscalerSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "HorizontalPodAutoscalerSpec",
        &[
            f(1, "scaleTargetRef", Msg("CrossVersionObjectReference")),
            p(2, "minReplicas", Int),
            f(3, "maxReplicas", Int),
            p(4, "targetCPUUtilizationPercentage", Int),
        ],
    ),
    (
        "CrossVersionObjectReference",
        &[
            f(1, "kind", Str),
            f(2, "name", Str),
            f(3, "apiVersion", Str),
        ],
    ),
    (
        "DeploymentSpec",
        &[
            p(1, "replicas", Int),
            f(2, "selector", Msg("LabelSelector")),
            f(3, "template", Msg("PodTemplateSpec")),
            f(4, "strategy", Msg("DeploymentStrategy")),
            f(5, "minReadySeconds", Int),
            p(6, "revisionHistoryLimit", Int),
            f(7, "paused", Bool),
            p(9, "progressDeadlineSeconds", Int),
        ],
    ),
    (
        "DeploymentStrategy",
        &[
            f(1, "type", Str),
            f(2, "rollingUpdate", Msg("RollingUpdateDeployment")),
        ],
    ),
    (
        "RollingUpdateDeployment",
        &[
            f(1, "maxUnavailable", IntOrString),
            f(2, "maxSurge", IntOrString),
        ],
    ),
    (
        "PodTemplateSpec",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("PodSpec")),
        ],
    ),
    (
        "PodSpec",
        &[
            r(2, "containers", Msg("Container")),
            f(3, "restartPolicy", Str),
            p(4, "terminationGracePeriodSeconds", Int),
            p(5, "activeDeadlineSeconds", Int),
            f(6, "dnsPolicy", Str),
            f(7, "nodeSelector", MapStr),
            f(8, "serviceAccountName", Str),
            f(9, "serviceAccount", Str),
            f(10, "nodeName", Str),
            f(11, "hostNetwork", Bool),
            f(12, "hostPID", Bool),
            f(13, "hostIPC", Bool),
            f(14, "securityContext", Msg("PodSecurityContext")),
            f(16, "hostname", Str),
            f(17, "subdomain", Str),
            f(19, "schedulerName", Str),
            r(20, "initContainers", Msg("Container")),
            p(21, "automountServiceAccountToken", Bool),
            f(24, "priorityClassName", Str),
            p(25, "priority", Int),
            p(30, "enableServiceLinks", Bool),
            p(31, "preemptionPolicy", Str),
        ],
    ),
    (
        "Container",
        &[
            f(1, "name", Str),
            f(2, "image", Str),
            r(3, "command", Str),
            r(4, "args", Str),
            f(5, "workingDir", Str),
            r(6, "ports", Msg("ContainerPort")),
            r(7, "env", Msg("EnvVar")),
            f(8, "resources", Msg("ResourceRequirements")),
            f(13, "terminationMessagePath", Str),
            f(14, "imagePullPolicy", Str),
            f(16, "stdin", Bool),
            f(17, "stdinOnce", Bool),
            f(18, "tty", Bool),
            f(20, "terminationMessagePolicy", Str),
        ],
    ),
    (
        "ContainerPort",
        &[
            f(1, "name", Str),
            f(2, "hostPort", Int),
            f(3, "containerPort", Int),
            f(4, "protocol", Str),
            f(5, "hostIP", Str),
        ],
    ),
    ("EnvVar", &[f(1, "name", Str), f(2, "value", Str)]),
    (
        "ResourceRequirements",
        &[f(1, "limits", MapQuantity), f(2, "requests", MapQuantity)],
    ),
    (
        "PodSecurityContext",
        &[
            p(2, "runAsUser", Int),
            p(3, "runAsNonRoot", Bool),
            r(4, "supplementalGroups", Int),
            p(5, "fsGroup", Int),
            p(6, "runAsGroup", Int),
            p(9, "fsGroupChangePolicy", Str),
        ],
    ),
    (
        "Job",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("JobSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "CronJob",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("CronJobSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "CronJobSpec",
        &[
            f(1, "schedule", Str),
            p(2, "startingDeadlineSeconds", Int),
            f(3, "concurrencyPolicy", Str),
            p(4, "suspend", Bool),
            f(5, "jobTemplate", Msg("JobTemplateSpec")),
            p(6, "successfulJobsHistoryLimit", Int),
            p(7, "failedJobsHistoryLimit", Int),
            p(8, "timeZone", Str),
        ],
    ),
    (
        "JobTemplateSpec",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("JobSpec")),
        ],
    ),
    (
        "JobSpec",
        &[
            p(1, "parallelism", Int),
            p(2, "completions", Int),
            p(3, "activeDeadlineSeconds", Int),
            f(4, "selector", Msg("LabelSelector")),
            p(5, "manualSelector", Bool),
            f(6, "template", Msg("PodTemplateSpec")),
            p(7, "backoffLimit", Int),
            p(8, "ttlSecondsAfterFinished", Int),
            p(9, "completionMode", Str),
            p(10, "suspend", Bool),
            f(11, "podFailurePolicy", Msg("PodFailurePolicy")),
            p(12, "backoffLimitPerIndex", Int),
            p(13, "maxFailedIndexes", Int),
            p(14, "podReplacementPolicy", Str),
            p(15, "managedBy", Str),
            f(16, "successPolicy", Msg("SuccessPolicy")),
        ],
    ),
    (
        "PodFailurePolicy",
        &[r(1, "rules", Msg("PodFailurePolicyRule"))],
    ),
    (
        "PodFailurePolicyRule",
        &[
            f(1, "action", Str),
            f(
                2,
                "onExitCodes",
                Msg("PodFailurePolicyOnExitCodesRequirement"),
            ),
            r(
                3,
                "onPodConditions",
                Msg("PodFailurePolicyOnPodConditionsPattern"),
            ),
        ],
    ),
    (
        "PodFailurePolicyOnExitCodesRequirement",
        &[
            p(1, "containerName", Str),
            f(2, "operator", Str),
            r(3, "values", Int),
        ],
    ),
    (
        "PodFailurePolicyOnPodConditionsPattern",
        &[f(1, "type", Str), f(2, "status", Str)],
    ),
    ("SuccessPolicy", &[r(1, "rules", Msg("SuccessPolicyRule"))]),
    (
        "SuccessPolicyRule",
        &[p(1, "succeededIndexes", Str), p(2, "succeededCount", Int)],
    ),
    (
        "PriorityClass",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "value", Int),
            f(3, "globalDefault", Bool),
            f(4, "description", Str),
            p(5, "preemptionPolicy", Str),
        ],
    ),
    (
        "ResourceQuota",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("ResourceQuotaSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "ResourceQuotaSpec",
        &[f(1, "hard", MapQuantity), r(2, "scopes", Str)],
    ),
    (
        "Role",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "rules", Msg("PolicyRule")),
        ],
    ),
    (
        "ClusterRole",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "rules", Msg("PolicyRule")),
            f(3, "aggregationRule", Msg("AggregationRule")),
        ],
    ),
    (
        "PolicyRule",
        &[
            r(1, "verbs", Str),
            r(2, "apiGroups", Str),
            r(3, "resources", Str),
            r(4, "resourceNames", Str),
            r(5, "nonResourceURLs", Str),
        ],
    ),
    (
        "AggregationRule",
        &[r(1, "clusterRoleSelectors", Msg("LabelSelector"))],
    ),
    (
        "RoleBinding",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "subjects", Msg("Subject")),
            f(3, "roleRef", Msg("RoleRef")),
        ],
    ),
    (
        "ClusterRoleBinding",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "subjects", Msg("Subject")),
            f(3, "roleRef", Msg("RoleRef")),
        ],
    ),
    (
        "Subject",
        &[
            f(1, "kind", Str),
            f(2, "apiGroup", Str),
            f(3, "name", Str),
            f(4, "namespace", Str),
        ],
    ),
    (
        "RoleRef",
        &[f(1, "apiGroup", Str), f(2, "kind", Str), f(3, "name", Str)],
    ),
    (
        "SelfSubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SelfSubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "SubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "LocalSubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "SubjectAccessReviewSpec",
        &[
            f(1, "resourceAttributes", Msg("ResourceAttributes")),
            f(2, "nonResourceAttributes", Msg("NonResourceAttributes")),
            f(3, "user", Str),
            r(4, "groups", Str),
            f(6, "uid", Str),
        ],
    ),
    (
        "SelfSubjectReview",
        &[f(1, "metadata", Msg("ObjectMeta")), f(2, "status", Ignored)],
    ),
    (
        "TokenReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("TokenReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "TokenReviewSpec",
        &[f(1, "token", Str), r(2, "audiences", Str)],
    ),
    (
        "SelfSubjectAccessReviewSpec",
        &[
            f(1, "resourceAttributes", Msg("ResourceAttributes")),
            f(2, "nonResourceAttributes", Msg("NonResourceAttributes")),
        ],
    ),
    (
        "ResourceAttributes",
        &[
            f(1, "namespace", Str),
            f(2, "verb", Str),
            f(3, "group", Str),
            f(4, "version", Str),
            f(5, "resource", Str),
            f(6, "subresource", Str),
            f(7, "name", Str),
        ],
    ),
    (
        "NonResourceAttributes",
        &[f(1, "path", Str), f(2, "verb", Str)],
    ),
    (
        "SelfSubjectRulesReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SelfSubjectRulesReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    ("SelfSubjectRulesReviewSpec", &[f(1, "namespace", Str)]),
    // networking.k8s.io/v1 (`kubectl create ingress`).
    (
        "Ingress",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("IngressSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "IngressSpec",
        &[
            f(1, "defaultBackend", Msg("IngressBackend")),
            r(2, "tls", Msg("IngressTLS")),
            r(3, "rules", Msg("IngressRule")),
            p(4, "ingressClassName", Str),
        ],
    ),
    (
        "IngressBackend",
        &[
            f(3, "resource", Msg("TypedLocalObjectReference")),
            f(4, "service", Msg("IngressServiceBackend")),
        ],
    ),
    (
        "IngressServiceBackend",
        &[f(1, "name", Str), f(2, "port", Msg("ServiceBackendPort"))],
    ),
    (
        "ServiceBackendPort",
        &[f(1, "name", Str), f(2, "number", Int)],
    ),
    (
        "TypedLocalObjectReference",
        &[p(1, "apiGroup", Str), f(2, "kind", Str), f(3, "name", Str)],
    ),
    ("IngressTLS", &[r(1, "hosts", Str), f(2, "secretName", Str)]),
    (
        "IngressRule",
        &[
            f(1, "host", Str),
            f(2, "ingressRuleValue", Inline("IngressRuleValue")),
        ],
    ),
    (
        "IngressRuleValue",
        &[f(1, "http", Msg("HTTPIngressRuleValue"))],
    ),
    (
        "HTTPIngressRuleValue",
        &[r(1, "paths", Msg("HTTPIngressPath"))],
    ),
    (
        "HTTPIngressPath",
        &[
            f(1, "path", Str),
            f(2, "backend", Msg("IngressBackend")),
            p(3, "pathType", Str),
        ],
    ),
    (
        "TokenRequest",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("TokenRequestSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "TokenRequestSpec",
        &[
            r(1, "audiences", Str),
            p(4, "expirationSeconds", Int),
            f(3, "boundObjectRef", Msg("BoundObjectReference")),
        ],
    ),
    (
        "BoundObjectReference",
        &[
            f(1, "kind", Str),
            f(2, "apiVersion", Str),
            f(3, "name", Str),
            f(4, "uid", Str),
        ],
    ),
];
