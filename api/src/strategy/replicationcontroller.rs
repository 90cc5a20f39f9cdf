//! ReplicationControllers: a plain map selector and labels, both taken from the template when
//! left out.

use serde_json::{json, Value};

use crate::admission::{
    child, default, default_template, invalid, validate_replicas, validate_template,
};
use crate::error::Cause;

use super::Strategy;

pub struct ReplicationController;

impl Strategy for ReplicationController {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "replicas", json!(1));
        default_template(spec);
        // An RC without a selector selects its template's labels, and an RC without labels
        // takes them from its template as well.
        let labels = spec
            .get("template")
            .and_then(|t| t.get("metadata"))
            .and_then(|m| m.get("labels"))
            .cloned()
            .unwrap_or(json!({}));
        default(spec, "selector", labels.clone());
        let meta = child(o, "metadata");
        default(meta, "labels", labels);
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_replicas(object, causes);
        // RC selectors are plain maps (defaulted from the template).
        let template_labels = object.pointer("/spec/template/metadata/labels");
        let selector = object.get("spec").and_then(|s| s.get("selector"));
        if let (Some(sel), labels) = (selector.and_then(Value::as_object), template_labels) {
            let matches = sel
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v));
            if !matches {
                causes.push(invalid(
                    "spec.template.metadata.labels",
                    format!(
                        "Invalid value: {}: `selector` does not match template `labels`",
                        labels.cloned().unwrap_or(json!({}))
                    ),
                ));
            }
        }
        validate_template(object, causes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_and_labels_come_from_the_template() {
        let mut rc = json!({"metadata": {"name": "rc"}, "spec": {"template": {
            "metadata": {"labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        ReplicationController.defaults(&mut rc);
        assert_eq!(rc["spec"]["selector"], json!({"app": "a"}));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "a"}));
        assert_eq!(rc["spec"]["replicas"], 1);
        let mut causes = Vec::new();
        ReplicationController.validate(&rc, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        rc["spec"]["selector"] = json!({"app": "b"});
        ReplicationController.validate(&rc, &mut causes);
        assert_eq!(causes[0].field, "spec.template.metadata.labels");
    }
}
