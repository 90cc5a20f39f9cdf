//! Leaf certificates: a certificate and key per member or client, issued by the CA into the PKI
//! directory.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use rcgen::{CertificateParams, SanType};

use crate::ca::Ca;
use crate::cert::{distinguished_name, generate_key, leaf_usages, set_validity};
use crate::error::PkiError;
use crate::files::{write_file, CERT_MODE, KEY_MODE};

/// How long a leaf certificate is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 60 * 60);

/// Issues `dir/<name>.crt` and `dir/<name>.key` (mode 0600), signed by the CA in `dir`.
///
/// The subject is `CN=<common_name>` plus `O=<organization>` when given (Kubernetes reads the
/// organization as the user's group). Each entry of `sans` becomes an IP SAN when it parses as an
/// IP address and a DNS SAN otherwise. `server` and `client` select the extended key usages
/// ServerAuth and ClientAuth; at least one must be set. The certificate is valid for five years.
///
/// Does nothing when both files already exist; when only one does, both are issued anew.
pub fn issue(
    dir: &Path,
    name: &str,
    common_name: &str,
    organization: Option<&str>,
    sans: &[String],
    server: bool,
    client: bool,
) -> Result<(), PkiError> {
    validate_name(name)?;
    if !server && !client {
        return Err(PkiError::NoUsage {
            name: name.to_string(),
        });
    }
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    if cert_path.exists() && key_path.exists() {
        return Ok(());
    }

    let ca = Ca::load(dir)?;

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(common_name, organization);
    params.subject_alt_names = sans
        .iter()
        .map(|san| parse_san(san))
        .collect::<Result<_, _>>()?;
    leaf_usages(&mut params, server, client);
    set_validity(&mut params, LEAF_VALIDITY)?;

    let key = generate_key("generate the certificate key")?;
    let cert = params
        .signed_by(&key, &ca.cert, &ca.key)
        .map_err(|source| PkiError::Generate {
            what: "sign the certificate with the CA",
            source,
        })?;

    write_file(
        &key_path,
        key.serialize_pem().as_bytes(),
        KEY_MODE,
        "private key",
    )?;
    write_file(&cert_path, cert.pem().as_bytes(), CERT_MODE, "certificate")
}

/// File stem of the certificate the API servers present to node agents (kubeadm's).
pub const KUBELET_CLIENT: &str = "apiserver-kubelet-client";

/// `dir/apiserver-kubelet-client.{crt,key}`: CN kube-apiserver-kubelet-client, the identity
/// every API server uses toward node agents, which accept only it.
pub fn issue_kubelet_client(dir: &Path) -> Result<(), PkiError> {
    issue(
        dir,
        KUBELET_CLIENT,
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        &[],
        false,
        true,
    )
}

fn parse_san(san: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = san.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    if san.is_empty() {
        return Err(PkiError::InvalidSan {
            san: san.to_string(),
            source: None,
        });
    }
    san.try_into()
        .map(SanType::DnsName)
        .map_err(|source| PkiError::InvalidSan {
            san: san.to_string(),
            source: Some(source),
        })
}

/// Names become file names beside `ca.crt`, so they must stay inside the directory and must not
/// shadow the CA itself.
fn validate_name(name: &str) -> Result<(), PkiError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name == "ca"
        || name.contains(['/', '\\', '\0']);
    if bad {
        return Err(PkiError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CA_KEY_FILE;
    use crate::testing::{handshake, LeafBuilder, Pki};
    use rcgen::{DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose};
    use std::fs;

    #[test]
    fn leaf_has_requested_subject_sans_and_usages() {
        struct Case {
            name: &'static str,
            server: bool,
            client: bool,
            ekus: Vec<ExtendedKeyUsagePurpose>,
        }
        let cases = [
            Case {
                name: "server-only",
                server: true,
                client: false,
                ekus: vec![ExtendedKeyUsagePurpose::ServerAuth],
            },
            Case {
                name: "client-only",
                server: false,
                client: true,
                ekus: vec![ExtendedKeyUsagePurpose::ClientAuth],
            },
            Case {
                name: "both",
                server: true,
                client: true,
                ekus: vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            },
        ];
        let pki = Pki::new();
        for case in cases {
            pki.leaf(case.name)
                .common_name("system:node:n1")
                .organization("system:nodes")
                .sans(&["n1.cluster.local", "10.0.0.7", "::1"])
                .usage(case.server, case.client)
                .issue();
            let pem = String::from_utf8(pki.read(&format!("{}.crt", case.name))).expect("utf8");
            // rcgen's parser reads the fields back; "from_ca_cert" does not require a CA.
            let params = CertificateParams::from_ca_cert_pem(&pem).expect("parse leaf");
            assert_eq!(params.extended_key_usages, case.ekus, "{}", case.name);
            assert_eq!(
                params.key_usages,
                vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment
                ],
                "{}",
                case.name
            );
            assert_eq!(params.is_ca, IsCa::ExplicitNoCa, "{}", case.name);
            assert_eq!(
                params.subject_alt_names,
                vec![
                    SanType::DnsName("n1.cluster.local".try_into().expect("ia5")),
                    SanType::IpAddress("10.0.0.7".parse().expect("ip")),
                    SanType::IpAddress("::1".parse().expect("ip")),
                ],
                "{}",
                case.name
            );
            assert_eq!(
                params.distinguished_name.get(&DnType::CommonName),
                Some(&rcgen::DnValue::Utf8String("system:node:n1".into()))
            );
            assert_eq!(
                params.distinguished_name.get(&DnType::OrganizationName),
                Some(&rcgen::DnValue::Utf8String("system:nodes".into()))
            );
            let days = (params.not_after - params.not_before).whole_days();
            assert_eq!(days, 5 * 365, "{}", case.name);

            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = fs::metadata(pki.path().join(format!("{}.key", case.name)))
                    .expect("stat key")
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{}", case.name);
            }
        }
    }

    #[test]
    fn issue_skips_existing_pair_and_reissues_a_half_pair() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let cert = pki.read("m1.crt");
        let key = pki.read("m1.key");

        pki.leaf("m1").issue();
        assert_eq!(pki.read("m1.crt"), cert);
        assert_eq!(pki.read("m1.key"), key);

        fs::remove_file(pki.path().join("m1.key")).expect("remove key");
        pki.leaf("m1").issue();
        assert_ne!(pki.read("m1.crt"), cert, "certificate was not reissued");
        let m = pki.material("m1");
        handshake(&m, &m, "localhost").expect("reissued pair works");
    }

    #[test]
    fn issue_rejects_bad_input() {
        let pki = Pki::new();
        let cases: [(&str, LeafBuilder<'_>); 6] = [
            ("empty name", pki.leaf("")),
            ("path in name", pki.leaf("../escape")),
            ("ca name", pki.leaf("ca")),
            ("no usage", pki.leaf("m1").usage(false, false)),
            ("non-ASCII DNS", pki.leaf("m2").sans(&["nöde.example"])),
            ("empty SAN", pki.leaf("m3").sans(&[""])),
        ];
        for (what, leaf) in cases {
            let err = leaf.try_issue().expect_err(what);
            let expected = match what {
                "empty name" | "path in name" | "ca name" => {
                    matches!(err, PkiError::InvalidName { .. })
                }
                "no usage" => matches!(err, PkiError::NoUsage { .. }),
                _ => matches!(err, PkiError::InvalidSan { .. }),
            };
            assert!(expected, "{what}: {err}");
        }
        assert!(!pki.path().join("m1.crt").exists());
    }

    #[test]
    fn issue_without_ca_or_with_mismatched_key_fails_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = issue(dir.path(), "m1", "m1", None, &[], true, true).expect_err("no CA");
        assert!(err.is_not_found(), "{err}");
        assert!(
            err.to_string().starts_with("cannot read CA certificate "),
            "{err}"
        );

        let pki = Pki::new();
        let other = Pki::new();
        fs::copy(other.path().join(CA_KEY_FILE), pki.path().join(CA_KEY_FILE)).expect("copy key");
        let err = pki.leaf("m1").try_issue().expect_err("mismatched key");
        assert!(matches!(err, PkiError::CaKeyMismatch { .. }), "{err}");
    }
}
