//! ConfigMaps: data keys must be valid config keys.

use serde_json::Value;

use crate::admission::validate_data_keys;
use crate::error::Cause;

use super::Strategy;

pub struct ConfigMap;

impl Strategy for ConfigMap {
    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_data_keys(object, causes);
    }
}
