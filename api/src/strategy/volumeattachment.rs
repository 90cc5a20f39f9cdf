//! VolumeAttachments: a CSI attacher's request to attach one volume to one node. The spec
//! is fixed once created; the attacher reports progress in the status.

use serde_json::{json, Value};

use crate::error::Cause;

use super::csinode::csi_driver_name;
use super::field::{dns_subdomain, forbidden, invalid, required, str_of};
use super::Strategy;

pub struct VolumeAttachment;

const ONE_SOURCE: &str = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";

impl Strategy for VolumeAttachment {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        csi_driver_name("spec.attacher", str_of(spec, "attacher"), causes);
        let source = spec.and_then(|s| s.get("source"));
        let pv = source.and_then(|s| s.get("persistentVolumeName"));
        let inline = source.and_then(|s| s.get("inlineVolumeSpec"));
        match (pv, inline) {
            (None, None) => causes.push(required("spec.source", ONE_SOURCE)),
            (Some(_), Some(_)) => causes.push(forbidden("spec.source", ONE_SOURCE)),
            (Some(pv), None) => match pv.as_str().unwrap_or("") {
                "" => causes.push(required(
                    "spec.source.persistentVolumeName",
                    "must specify non empty persistentVolumeName",
                )),
                name => dns_subdomain("spec.source.persistentVolumeName", name, causes),
            },
            (None, Some(_)) => {}
        }
        dns_subdomain("spec.nodeName", str_of(spec, "nodeName"), causes);
    }

    /// The spec is read-only once created.
    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        if current.get("spec") != new.get("spec") {
            causes.push(invalid(
                "spec",
                new.get("spec").unwrap_or(&json!(null)),
                "field is immutable",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attacher_source_and_node() {
        let ok = json!({"attacher": "hostpath.csi.k8s.io", "nodeName": "n1",
                        "source": {"persistentVolumeName": "pv1"}});
        // (spec, the (field, message) pairs refused)
        let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (ok.clone(), vec![]),
            (
                json!({"attacher": "a.io", "nodeName": "n1", "source": {}}),
                vec![("spec.source", "Required value: must specify exactly one of inlineVolumeSpec and persistentVolumeName")],
            ),
            (
                json!({"attacher": "a.io", "nodeName": "n1", "source": {"persistentVolumeName": "p", "inlineVolumeSpec": {}}}),
                vec![("spec.source", "Forbidden: must specify exactly one of inlineVolumeSpec and persistentVolumeName")],
            ),
            (
                json!({"nodeName": "n1", "source": {"persistentVolumeName": "p"}}),
                vec![
                    ("spec.attacher", "Required value"),
                    ("spec.attacher", "Invalid value: \"\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
                ],
            ),
        ];
        for (spec, want) in cases {
            let mut causes = Vec::new();
            VolumeAttachment.validate(
                &json!({"metadata": {"name": "va"}, "spec": spec}),
                &mut causes,
            );
            let got: Vec<(&str, &str)> = causes
                .iter()
                .map(|c| (c.field.as_str(), c.message.as_str()))
                .collect();
            assert_eq!(got, want);
        }
        let old = json!({"spec": ok});
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!("n2");
        let mut causes = Vec::new();
        VolumeAttachment.validate_update(&old, &new, &mut causes);
        assert_eq!(causes[0].field, "spec");
        assert!(causes[0].message.ends_with("field is immutable"));
    }
}
