//! Cluster PKI: the certificate authority and the member certificates that secure rkube's gRPC
//! traffic with mutual TLS.
//!
//! The layout follows kubeadm's `/etc/kubernetes/pki`: one directory holds the cluster CA
//! (`ca.crt`, `ca.key`) and, beside it, a `<name>.crt` / `<name>.key` pair per member or client.
//!
//! - [`init_ca`] creates the CA once; later calls leave it alone.
//! - [`issue`] signs a leaf certificate with that CA, once per name.
//! - [`TlsFiles`] names the three files a member needs and [`TlsFiles::load`] reads them into
//!   [`TlsMaterial`], which builds tonic's server and client TLS configurations. Both sides
//!   present a certificate and check the peer's against the CA.
//! - [`ca_spki_sha256`] pins the CA the way kubeadm's `--discovery-token-ca-cert-hash` does, so a
//!   joining member can check it talks to the right cluster before it trusts the CA it is handed.
//!
//! Keys are ECDSA P-256, written as PKCS#8 PEM with mode 0600; certificates are PEM.

mod ca;
mod cert;
mod csr;
mod error;
mod files;
mod leaf;
mod service_account;
#[cfg(test)]
mod testing;
mod tls;

pub use ca::{ca_spki_sha256, init_ca, CA_CERT_FILE, CA_COMMON_NAME, CA_KEY_FILE};
pub use cert::validity;
pub use csr::{new_csr, parse_csr, CsrSigner, CsrSubject, CLIENT_SIGNER, KUBELET_CLIENT_SIGNER};
pub use error::PkiError;
pub use files::write_private;
pub use leaf::{issue, issue_kubelet_client, KUBELET_CLIENT};
pub use service_account::{init_service_account_key, load_service_account_key, SA_KEY_FILE};
pub use tls::{TlsFiles, TlsMaterial};
