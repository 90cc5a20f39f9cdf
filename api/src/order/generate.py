#!/usr/bin/env python3
"""Writes fields.txt: the JSON field order of Kubernetes' built-in types (the order of their Go
structs), read from the protobuf descriptors that a kubectl binary embeds (gzipped
FileDescriptorProtos; generated.proto lists every struct's fields in Go order).

Usage: api/src/order/generate.py KUBECTL > api/src/order/fields.txt

Output, one line each:
  K <apiVersion> <Kind> <message>      a kind the server serves and its message
  M <message> <field>... with each field <name>:<type>, where <type> is
      -          a scalar, or a value written as a string or left as it is (Quantity, Time,
                 IntOrString, RawExtension, FieldsV1)
      =<msg>     an object of message <msg> (or a list of them)
      %          a map (Go writes its keys sorted); %<msg> when its values are messages
      ^<msg>     a message whose fields Go writes inline, in this place
"""
import sys
import zlib

# The kinds rkube serves: (apiVersion, Kind). A group maps to the package k8s.io.api.<first
# label of the group>.<version>; the core group to core.
KINDS = """
v1 Binding ComponentStatus ConfigMap Endpoints Event LimitRange Namespace Node PersistentVolume
   PersistentVolumeClaim Pod PodTemplate ReplicationController ResourceQuota Secret Service
   ServiceAccount
apps/v1 ControllerRevision DaemonSet Deployment ReplicaSet StatefulSet
authentication.k8s.io/v1 SelfSubjectReview TokenRequest TokenReview
authorization.k8s.io/v1 LocalSubjectAccessReview SelfSubjectAccessReview SelfSubjectRulesReview
   SubjectAccessReview
autoscaling/v1 HorizontalPodAutoscaler Scale
autoscaling/v2 HorizontalPodAutoscaler
batch/v1 CronJob Job
certificates.k8s.io/v1 CertificateSigningRequest
coordination.k8s.io/v1 Lease
discovery.k8s.io/v1 EndpointSlice
events.k8s.io/v1 Event
metrics.k8s.io/v1beta1 NodeMetrics PodMetrics
networking.k8s.io/v1 Ingress IngressClass NetworkPolicy
node.k8s.io/v1 RuntimeClass
policy/v1 PodDisruptionBudget Eviction
rbac.authorization.k8s.io/v1 ClusterRole ClusterRoleBinding Role RoleBinding
scheduling.k8s.io/v1 PriorityClass
storage.k8s.io/v1 CSIDriver CSINode CSIStorageCapacity StorageClass VolumeAttachment
"""

# Messages written as a JSON scalar or kept as they are.
OPAQUE = {
    "k8s.io.apimachinery.pkg.api.resource.Quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "k8s.io.apimachinery.pkg.runtime.RawExtension",
}

# Fields that Go embeds with `json:",inline"`: their message's fields sit in the enclosing
# object (so does every embedded LocalObjectReference, whatever its struct).
INLINE = {
    ("k8s.io.api.core.v1.Volume", "volumeSource"),
    ("k8s.io.api.core.v1.PersistentVolumeSpec", "persistentVolumeSource"),
    ("k8s.io.api.core.v1.Probe", "handler"),
    ("k8s.io.api.core.v1.EphemeralContainer", "ephemeralContainerCommon"),
    ("k8s.io.api.networking.v1.IngressRule", "ingressRuleValue"),
}

# Messages every answer uses besides the kinds' own.
EXTRA = [
    "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
    "k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta",
]


def varint(b, i):
    shift = result = 0
    while True:
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return result, i


# Fields whose generated.proto name is not their JSON name (uid, apiGroup).
PROTO_TO_JSON = {"uID": "uid", "aPIGroup": "apiGroup"}


def fields(b):
    """(number, value) of a protobuf message; value is an int or bytes."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v, i = b[i : i + n], i + n
        elif wt == 1:
            v, i = b[i : i + 8], i + 8
        elif wt == 5:
            v, i = b[i : i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, v


def message(b, prefix, out):
    name, fs, nested, map_entry = None, [], [], False
    for num, v in fields(b):
        if num == 1:
            name = v.decode()
        elif num == 2:
            f = dict(fields(v))
            fs.append((f[1].decode(), f.get(6, b"").decode().lstrip(".")))
        elif num == 3:
            nested.append(v)
        elif num == 7:
            map_entry = dict(fields(v)).get(7, 0) == 1
    full = prefix + "." + name
    out[full] = (fs, map_entry)
    for n in nested:
        message(n, full, out)


def descriptors(path):
    data = open(path, "rb").read()
    out = {}
    i = 0
    magic = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"
    while (i := data.find(magic, i)) >= 0:
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data[i : i + 4_000_000])
            f = list(fields(raw))
            names = [v for n, v in f if n == 1]
            if names and names[0].endswith(b"generated.proto"):
                package = next(v for n, v in f if n == 2).decode()
                for n, v in f:
                    if n == 4:
                        message(v, package, out)
        except Exception:
            pass
        i += 1
    return out


def package(api_version):
    group, _, version = api_version.rpartition("/")
    if group == "metrics.k8s.io":
        return "k8s.io.metrics.pkg.apis.metrics." + version
    return "k8s.io.api.%s.%s" % (group.split(".")[0] if group else "core", version)


def main():
    msgs = descriptors(sys.argv[1])
    roots, kinds = list(EXTRA), []
    for line in KINDS.split("\n"):
        words = line.split()
        if not words:
            continue
        if "/" in words[0] or words[0] == "v1":
            api_version, names = words[0], words[1:]
        else:
            names = words
        for kind in names:
            m = package(api_version) + "." + kind
            if m not in msgs:
                sys.exit("no message %s for %s %s" % (m, api_version, kind))
            kinds.append((api_version, kind, m))
            roots.append(m)
    done, order = set(), []
    while roots:
        m = roots.pop(0)
        if m in done or m in OPAQUE:
            continue
        done.add(m)
        order.append(m)
        for _, t in msgs[m][0]:
            if t and t not in OPAQUE:
                roots.append(t)
    print("# Generated by generate.py from kubectl's embedded descriptors; do not edit.")
    for api_version, kind, m in kinds:
        print("K", api_version, kind, m)
    for m in order:
        fs, map_entry = msgs[m]
        if map_entry:
            continue
        words = []
        for name, t in fs:
            # generated.proto spells a few fields unlike their JSON tags.
            name = PROTO_TO_JSON.get(name, name)
            if not t or t in OPAQUE:
                words.append(name + ":-")
            elif msgs[t][1]:
                value = dict(msgs[t][0]).get("value", "")
                words.append(name + ":%" + ("" if not value or value in OPAQUE else value))
            elif (m, name) in INLINE or name == "localObjectReference":
                words.append(name + ":^" + t)
            else:
                words.append(name + ":=" + t)
        print("M", m, *words)


main()
