//! Request bodies: reading them (at most `MAX_BODY` bytes) and decoding JSON, YAML or protobuf.

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Request;
use serde_json::Value;

use crate::error::ApiError;

use super::MAX_BODY;

pub(super) async fn read_body(req: Request<Body>) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(req.into_body(), MAX_BODY);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_BODY}"),
            ))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body failed: {e}"
        ))),
    }
}

pub(super) fn decode_body(body: &Bytes, content_type: &str) -> Result<Value, ApiError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let v: Value = match ct {
        "" | "application/json" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        "application/vnd.kubernetes.protobuf" => crate::protobuf::decode(body)?,
        "application/yaml" => serde_yaml::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as YAML: {e}"
            ))
        })?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the request body is not a JSON object",
        ));
    }
    Ok(v)
}
