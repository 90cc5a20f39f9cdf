//! CertificateSigningRequest admission: the server, not the requester, fills in who asked
//! (`spec.username`, `uid`, `groups`, `extra`), and a request must carry a parsable PKCS#10
//! request and a signer. For the kubelet client signer the subject must be a node's.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde_json::{json, Value};

use crate::auth::User;
use crate::error::{ApiError, Cause};

use rkube_pki::KUBELET_CLIENT_SIGNER;

/// Records the requesting user in the CSR's spec and drops any status the body carried.
pub fn stamp(user: &User, csr: &mut Value) {
    let extra: serde_json::Map<String, Value> = user
        .extra
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    crate::value::set(csr, &["spec", "username"], json!(user.name));
    crate::value::set(csr, &["spec", "groups"], json!(user.groups));
    if user.uid.is_empty() {
        if let Some(spec) = csr.get_mut("spec").and_then(Value::as_object_mut) {
            spec.shift_remove("uid");
        }
    } else {
        crate::value::set(csr, &["spec", "uid"], json!(user.uid));
    }
    if extra.is_empty() {
        if let Some(spec) = csr.get_mut("spec").and_then(Value::as_object_mut) {
            spec.shift_remove("extra");
        }
    } else {
        crate::value::set(csr, &["spec", "extra"], Value::Object(extra));
    }
    if let Some(o) = csr.as_object_mut() {
        o.shift_remove("status");
    }
}

/// The PEM request a CSR object carries (`spec.request`, base64 in JSON).
pub fn request_pem(csr: &Value) -> Option<String> {
    let b64 = csr.pointer("/spec/request").and_then(Value::as_str)?;
    STANDARD
        .decode(b64)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Validation of a new CSR, with Kubernetes' field paths.
pub fn validate(csr: &Value) -> Result<(), ApiError> {
    let name = csr
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let invalid = |field: &str, message: String| {
        ApiError::invalid(
            "certificates.k8s.io",
            "CertificateSigningRequest",
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                field: field.into(),
                message,
            }],
        )
    };
    let signer = csr
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if signer.is_empty() {
        return Err(invalid("spec.signerName", "Required value".into()));
    }
    if !signer.contains('/') {
        return Err(invalid(
            "spec.signerName",
            format!("Invalid value: {signer:?}: must be a fully qualified domain and path of the form 'example.com/signer-name'"),
        ));
    }
    let pem = request_pem(csr).ok_or_else(|| {
        invalid(
            "spec.request",
            "Required value: a base64-encoded PEM CERTIFICATE REQUEST".into(),
        )
    })?;
    let subject = rkube_pki::parse_csr(&pem)
        .map_err(|e| invalid("spec.request", format!("Invalid value: []byte{{...}}: {e}")))?;
    if let Some(secs) = csr.pointer("/spec/expirationSeconds") {
        if secs.as_i64().is_none_or(|s| s < 600) {
            return Err(invalid(
                "spec.expirationSeconds",
                format!("Invalid value: {secs}: may not specify a duration less than 600 seconds (10 minutes)"),
            ));
        }
    }
    if signer == KUBELET_CLIENT_SIGNER {
        if subject.organizations != ["system:nodes"] {
            return Err(invalid(
                "spec.request",
                "Invalid value: []byte{...}: subject organization is not system:nodes".into(),
            ));
        }
        if !subject.common_name.starts_with("system:node:") {
            return Err(invalid(
                "spec.request",
                "Invalid value: []byte{...}: subject common name does not begin with system:node:"
                    .into(),
            ));
        }
        if !subject.sans.is_empty() {
            return Err(invalid(
                "spec.request",
                "Invalid value: []byte{...}: DNS or IP subjectAltNames are not allowed".into(),
            ));
        }
        let usages: Vec<&str> = csr
            .pointer("/spec/usages")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let allowed = ["digital signature", "key encipherment", "client auth"];
        if !usages.contains(&"client auth") || usages.iter().any(|u| !allowed.contains(u)) {
            return Err(invalid(
                "spec.usages",
                format!("Unsupported value: {usages:?}: supported values: \"client auth\", \"digital signature\", \"key encipherment\""),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(cn: &str, o: &[&str], usages: &[&str]) -> Value {
        let (pem, _) = rkube_pki::new_csr(cn, o).unwrap();
        json!({"metadata": {"name": "x"}, "spec": {
            "request": STANDARD.encode(pem), "signerName": KUBELET_CLIENT_SIGNER,
            "usages": usages}, "status": {"certificate": "Zm9v"}})
    }

    #[test]
    fn the_requester_is_stamped_and_status_dropped() {
        let mut c = csr("system:node:n1", &["system:nodes"], &["client auth"]);
        crate::value::set(&mut c, &["spec", "username"], json!("someone-else"));
        let user = User {
            name: "system:bootstrap:abcdef".into(),
            groups: vec!["system:bootstrappers".into()],
            ..User::default()
        };
        stamp(&user, &mut c);
        assert_eq!(c["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(c["spec"]["groups"], json!(["system:bootstrappers"]));
        assert!(c.get("status").is_none());
    }

    #[test]
    fn kubelet_client_requests_must_name_a_node() {
        assert!(validate(&csr(
            "system:node:n1",
            &["system:nodes"],
            &["digital signature", "client auth"]
        ))
        .is_ok());
        assert!(validate(&csr("admin", &["system:masters"], &["client auth"])).is_err());
        assert!(validate(&csr("system:node:n1", &["system:nodes"], &["server auth"])).is_err());
        let mut bad = csr("system:node:n1", &["system:nodes"], &["client auth"]);
        bad["spec"]["request"] = json!(STANDARD.encode("garbage"));
        let e = validate(&bad).unwrap_err();
        assert_eq!(e.code, 422);
    }
}
