//! PodTemplates: a pod template stored on its own (`template`, no spec), with a pod spec's
//! defaults and checks; its generation counts changes to the template.

use serde_json::Value;

use crate::admission::{child, default_pod_spec, validate_pod_spec};
use crate::error::Cause;

use super::Strategy;

pub struct PodTemplate;

impl Strategy for PodTemplate {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let template = child(o, "template");
        child(template, "metadata");
        default_pod_spec(child(template, "spec"));
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_pod_spec(object.pointer("/template/spec"), "template.spec", causes);
    }

    /// A PodTemplate has no spec: changes to its template count in its generation.
    fn generation_source<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        object.get("template")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_template_counts_in_the_generation() {
        let t = json!({"template": {"spec": {"containers": [{"name": "c", "image": "a"}]}}});
        assert_eq!(PodTemplate.generation_source(&t), t.get("template"));
    }

    #[test]
    fn the_template_gets_a_pod_spec_s_defaults_and_checks() {
        let mut pt = json!({"metadata": {"name": "t"}, "template": {"spec": {
            "containers": [{"name": "c", "image": "nginx:1.27"}]}}});
        PodTemplate.defaults(&mut pt);
        assert_eq!(pt["template"]["spec"]["restartPolicy"], "Always");
        assert_eq!(
            pt["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        // (object, the fields refused)
        let cases = [
            (pt.clone(), vec![]),
            (json!({"template": {}}), vec!["template.spec.containers"]),
            (json!({}), vec!["template.spec.containers"]),
        ];
        for (object, want) in cases {
            let mut causes = Vec::new();
            PodTemplate.validate(&object, &mut causes);
            let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(fields, want, "{object}");
        }
    }
}
