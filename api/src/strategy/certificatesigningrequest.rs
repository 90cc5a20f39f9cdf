//! CertificateSigningRequests: the server, not the requester, records who asked, and a new
//! request must carry a parsable PKCS#10 request and a signer (the rules are in
//! [`crate::certificates`]).

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;

use super::Strategy;

pub struct CertificateSigningRequest;

impl Strategy for CertificateSigningRequest {
    fn prepare_for_user(&self, user: &User, csr: &mut Value) -> Result<(), ApiError> {
        crate::certificates::stamp(user, csr);
        crate::certificates::validate(csr)
    }
}
