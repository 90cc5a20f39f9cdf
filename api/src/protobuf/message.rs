//! A message into JSON, field by field as its schema describes it: Kubernetes' times,
//! quantities and int-or-strings into their JSON forms, maps into objects, repeated fields into
//! lists, unset scalars left out.

use base64::Engine;
use serde_json::{json, Map, Value};

use super::schema::{Ty::*, MESSAGES};
use super::wire::{bytes_of, entry, fields, string, varints, Wire};
use super::{bad, unsupported};
use crate::error::ApiError;

fn time(b: &[u8]) -> Result<Value, ApiError> {
    let mut seconds: i64 = 0;
    for (num, w) in fields(b)? {
        if let (1, Wire::Varint(v)) = (num, w) {
            seconds = v as i64;
        }
    }
    let t =
        chrono::DateTime::from_timestamp(seconds, 0).ok_or_else(|| bad("a time out of range"))?;
    Ok(json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
}

fn quantity(b: &[u8]) -> Result<Value, ApiError> {
    for (num, w) in fields(b)? {
        if num == 1 {
            return Ok(json!(string(bytes_of(&w, "a quantity")?)?));
        }
    }
    Ok(json!("0"))
}

fn int_or_string(b: &[u8]) -> Result<Value, ApiError> {
    let (mut ty, mut int, mut s) = (0u64, 0i64, String::new());
    for (num, w) in fields(b)? {
        match (num, w) {
            (1, Wire::Varint(v)) => ty = v,
            (2, Wire::Varint(v)) => int = v as i32 as i64,
            (3, Wire::Bytes(b)) => s = string(b)?,
            _ => {}
        }
    }
    Ok(if ty == 1 { json!(s) } else { json!(int) })
}

pub(super) fn message(name: &str, b: &[u8], depth: usize) -> Result<Value, ApiError> {
    if depth > 32 {
        return Err(bad("messages nested too deeply"));
    }
    let schema = MESSAGES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| unsupported(&format!("the message {name}")))?;
    let mut out = Map::new();
    for (num, w) in fields(b)? {
        let field = schema
            .iter()
            .find(|f| f.num == num)
            .ok_or_else(|| unsupported(&format!("field {num} of {name}")))?;
        // A repeated number may come packed (one length-delimited field of varints, proto3's
        // and many encoders' way) or not (a field per element, as Kubernetes' Go types write
        // their proto2 messages); both mean the same list.
        if let (true, Int | Bool, Wire::Bytes(b)) = (field.repeated, field.ty, &w) {
            let values = varints(b)?;
            if values.is_empty() {
                continue;
            }
            let list = out
                .entry(field.name.to_string())
                .or_insert_with(|| json!([]));
            if let Some(l) = list.as_array_mut() {
                l.extend(values.into_iter().map(|v| match field.ty {
                    Bool => json!(v != 0),
                    _ => json!(v as i64),
                }));
            }
            continue;
        }
        let value = match (field.ty, &w) {
            (Ignored, _) => continue,
            (Str, Wire::Bytes(b)) if b.is_empty() && !field.pointer && !field.repeated => continue,
            (Int, Wire::Varint(0)) | (Bool, Wire::Varint(0))
                if !field.pointer && !field.repeated =>
            {
                continue
            }
            (Time, Wire::Bytes(b))
                if fields(b)?.iter().all(|(_, w)| matches!(w, Wire::Varint(0))) =>
            {
                continue
            }
            (Str, Wire::Bytes(b)) => json!(string(b)?),
            (Int, Wire::Varint(v)) => json!(*v as i64),
            (Bool, Wire::Varint(v)) => json!(*v != 0),
            (Msg(m), Wire::Bytes(b)) => message(m, b, depth + 1)?,
            (Inline(m), Wire::Bytes(b)) => {
                if let Value::Object(fields) = message(m, b, depth + 1)? {
                    out.extend(fields);
                }
                continue;
            }
            (Time, Wire::Bytes(b)) => time(b)?,
            (IntOrString, Wire::Bytes(b)) => int_or_string(b)?,
            (MapStr | MapBytes | MapQuantity, Wire::Bytes(b)) => {
                let (k, v) = entry(b)?;
                let v = v.unwrap_or_default();
                let v = match field.ty {
                    MapStr => json!(string(v)?),
                    MapBytes => json!(base64::engine::general_purpose::STANDARD.encode(v)),
                    _ => quantity(v)?,
                };
                let map = out
                    .entry(field.name.to_string())
                    .or_insert_with(|| json!({}));
                if let Some(m) = map.as_object_mut() {
                    m.insert(k, v);
                }
                continue;
            }
            _ => {
                return Err(bad(&format!(
                    "field {} of {name} has the wrong wire type",
                    field.name
                )))
            }
        };
        if field.repeated {
            let list = out
                .entry(field.name.to_string())
                .or_insert_with(|| json!([]));
            if let Some(l) = list.as_array_mut() {
                l.push(value);
            }
        } else {
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}
