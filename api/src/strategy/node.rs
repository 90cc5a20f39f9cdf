//! Nodes: a new node is Pending until its agent reports.

use serde_json::{json, Value};

use crate::admission::{child, default};

use super::Strategy;

pub struct Node;

impl Strategy for Node {
    fn defaults(&self, object: &mut Value) {
        if let Some(o) = object.as_object_mut() {
            let status = child(o, "status");
            default(status, "phase", json!("Pending"));
        }
    }
}
