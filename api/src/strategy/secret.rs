//! Secrets: type Opaque by default, and config keys as data keys.

use serde_json::{json, Value};

use crate::admission::{default, validate_data_keys};
use crate::error::Cause;

use super::Strategy;

pub struct Secret;

impl Strategy for Secret {
    fn defaults(&self, object: &mut Value) {
        if let Some(o) = object.as_object_mut() {
            default(o, "type", json!("Opaque"));
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_data_keys(object, causes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_by_default_and_keys_checked() {
        let mut s = json!({"data": {"ok.key": "", "bad/key": ""}});
        Secret.defaults(&mut s);
        assert_eq!(s["type"], "Opaque");
        let mut causes = Vec::new();
        Secret.validate(&s, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "data[bad/key]");
    }
}
