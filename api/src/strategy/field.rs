//! Kubernetes' field errors (`k8s.io/apimachinery/pkg/util/validation/field`) as [`Cause`]s,
//! worded as kube-apiserver words them, and the checks several kinds' validation shares.

use serde_json::{json, Value};

use crate::admission::{check_label, check_subdomain};
use crate::error::Cause;

/// A value as a field error prints it: strings quoted, numbers and booleans bare.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

/// `field: Required value[: detail]`.
pub(crate) fn required(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.into(),
        message: if detail.is_empty() {
            "Required value".into()
        } else {
            format!("Required value: {detail}")
        },
    }
}

/// `field: Invalid value: <value>: detail`.
pub(crate) fn invalid(field: &str, value: &Value, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: format!("Invalid value: {}: {detail}", shown(value)),
    }
}

/// `field: Unsupported value: "x": supported values: "a", "b"`.
pub(crate) fn not_supported(field: &str, value: &Value, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    Cause {
        reason: "FieldValueNotSupported",
        field: field.into(),
        message: format!(
            "Unsupported value: {}: supported values: {}",
            shown(value),
            list.join(", ")
        ),
    }
}

/// `field: Forbidden: detail`.
pub(crate) fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        field: field.into(),
        message: format!("Forbidden: {detail}"),
    }
}

/// `field: Duplicate value: <value>`.
pub(crate) fn duplicate(field: &str, value: &Value) -> Cause {
    Cause {
        reason: "FieldValueDuplicate",
        field: field.into(),
        message: format!("Duplicate value: {}", shown(value)),
    }
}

/// The string at `key` of an object, or "" when absent.
pub(crate) fn str_of<'a>(v: Option<&'a Value>, key: &str) -> &'a str {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The items of the array at `key` of an object (none when absent).
pub(crate) fn items<'a>(v: Option<&'a Value>, key: &str) -> &'a [Value] {
    v.and_then(|v| v.get(key))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A DNS label (RFC 1123) at `field`, with Kubernetes' message when it is not one.
pub(crate) fn dns_label(field: &str, value: &str, causes: &mut Vec<Cause>) {
    if let Some(message) = check_label(value) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message,
        });
    }
}

/// A DNS subdomain (RFC 1123) at `field`, with Kubernetes' message when it is not one.
pub(crate) fn dns_subdomain(field: &str, value: &str, causes: &mut Vec<Cause>) {
    if let Some(message) = check_subdomain(value) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message,
        });
    }
}

/// IsDomainPrefixedPath: `example.com/ingress-controller`.
pub(crate) fn domain_prefixed_path(at: &str, value: &str, causes: &mut Vec<Cause>) {
    match value.split_once('/') {
        Some((host, path)) if !host.is_empty() && !path.is_empty() => {
            dns_subdomain(at, host, causes);
            let ok = path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-._~%!$&'()*+,;=:".contains(c));
            if !ok {
                causes.push(invalid(at, &json!(path), "Invalid path: must consist of alphanumeric characters, '/', '-', '.', '_', '~', '%', '!', '$', '&', ''', '(', ')', '*', '+', ',', ';', '=', ':'"));
            }
        }
        _ => causes.push(invalid(
            at,
            &json!(value),
            "must be a domain-prefixed path (such as \"acme.io/foo\")",
        )),
    }
}

/// `field: Too long: may not be more than <max> bytes`.
pub(crate) fn too_long(field: &str, max: usize) -> Cause {
    Cause {
        reason: "FieldValueTooLong",
        field: field.into(),
        message: format!("Too long: may not be more than {max} bytes"),
    }
}

/// A port number (IsValidPortNum).
pub(crate) fn port_number(field: &str, value: &Value, causes: &mut Vec<Cause>) {
    if !value.as_i64().is_some_and(|n| (1..=65535).contains(&n)) {
        causes.push(invalid(
            field,
            value,
            "must be between 1 and 65535, inclusive",
        ));
    }
}

/// A named port (IsValidPortName): an IANA service name.
pub(crate) fn port_name(field: &str, name: &str, causes: &mut Vec<Cause>) {
    let v = Value::String(name.into());
    if name.is_empty() || name.len() > 15 {
        causes.push(invalid(field, &v, "must be no more than 15 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        causes.push(invalid(
            field,
            &v,
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
        ));
    }
    if name.contains("--") {
        causes.push(invalid(field, &v, "must not contain consecutive hyphens"));
    }
    if name.starts_with('-') || name.ends_with('-') {
        causes.push(invalid(field, &v, "must not begin or end with a hyphen"));
    }
    if !name.chars().any(|c| c.is_ascii_lowercase()) {
        causes.push(invalid(field, &v, "must contain at least one letter (a-z)"));
    }
}

/// A `metav1.LabelSelector` (ValidateLabelSelector): its expressions' operators and values.
pub(crate) fn label_selector(field: &str, selector: Option<&Value>, causes: &mut Vec<Cause>) {
    for (i, e) in items(selector, "matchExpressions").iter().enumerate() {
        let at = format!("{field}.matchExpressions[{i}]");
        let values = items(Some(e), "values");
        match str_of(Some(e), "operator") {
            "In" | "NotIn" if values.is_empty() => causes.push(required(
                &format!("{at}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => causes.push(forbidden(
                &format!("{at}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => causes.push(invalid(
                &format!("{at}.operator"),
                &Value::String(other.into()),
                "not a valid selector operator",
            )),
        }
        if str_of(Some(e), "key").is_empty() {
            causes.push(invalid(
                &format!("{at}.key"),
                &Value::String(String::new()),
                "name part must be non-empty",
            ));
        }
    }
}

/// A CIDR (`10.0.0.0/16`, `fd00::/64`): the address and its prefix length.
pub(crate) fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (ip, bits) = s.split_once('/')?;
    let ip: std::net::IpAddr = ip.parse().ok()?;
    let bits: u8 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max).then_some((ip, bits))
}

/// Whether `net/bits` holds `ip`.
pub(crate) fn cidr_contains(net: (std::net::IpAddr, u8), ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let (width, a, b) = match (net.0, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            (32u32, u128::from(u32::from(n)), u128::from(u32::from(i)))
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => (128, u128::from(n), u128::from(i)),
        _ => return false,
    };
    let host = width.saturating_sub(u32::from(net.1));
    let mask = if host >= 128 { 0 } else { u128::MAX << host };
    a & mask == b & mask
}
