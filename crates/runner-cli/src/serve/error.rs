//! [`ApiError`]: an HTTP status with an OpenAI-style error object
//! (`{"error": {"message", "type", "param", "code"}}`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// A request that cannot be served, as the client sees it.
#[derive(Debug, Clone)]
pub(super) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    /// The request field at fault (`None`: the request as a whole).
    param: Option<String>,
    code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: String) -> ApiError {
        ApiError {
            status,
            kind,
            message,
            param: None,
            code: None,
        }
    }

    /// 400: a bad value of `param` (empty: no single field).
    pub(super) fn invalid(param: &str, message: String) -> ApiError {
        ApiError {
            param: (!param.is_empty()).then(|| param.to_owned()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400: the body is not JSON.
    pub(super) fn bad_json(message: String) -> ApiError {
        ApiError {
            code: Some("invalid_json"),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400: `model` names a model this server does not serve.
    pub(super) fn unknown_model(asked: &str, served: &str) -> ApiError {
        ApiError {
            code: Some("model_not_found"),
            ..ApiError::invalid(
                "model",
                format!(
                    "model `{asked}` is not served here: this server serves `{served}` \
                     (GET /v1/models)"
                ),
            )
        }
    }

    /// 413: the body is over the limit.
    pub(super) fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "the request body is over the {limit}-byte limit; send less, or start the server \
                 with a larger --max-body-bytes"
            ),
        )
    }

    /// 408: the body did not all come within `--read-timeout`.
    pub(super) fn body_timeout(secs: u64) -> ApiError {
        ApiError {
            code: Some("request_timeout"),
            ..ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {secs}s: send it at once, or start \
                     the server with a larger --read-timeout"
                ),
            )
        }
    }

    /// 429: the queue is full.
    pub(super) fn queue_full(queue: usize) -> ApiError {
        ApiError {
            code: Some("queue_full"),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "the request queue is full ({queue} waiting): retry later, or start the \
                     server with a larger --queue-size"
                ),
            )
        }
    }

    /// 503: the server cannot take the request now.
    pub(super) fn unavailable(message: &str) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message.to_owned(),
        )
    }

    /// 500: our failure.
    pub(super) fn internal(message: String) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 404: no such route.
    pub(super) fn not_found(path: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "no route {path}: this server has POST /v1/chat/completions, POST /v1/completions, \
                 GET /v1/models, GET /health and GET /metrics"
            ),
        )
    }

    /// 405: the route exists with another method.
    pub(super) fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{method} is not allowed on {path}"),
        )
    }

    /// True for a 5xx status.
    pub(super) fn is_server_error(&self) -> bool {
        self.status.is_server_error()
    }

    /// The error object (`{"error": ...}`), also sent inside an event stream.
    pub(super) fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // The rest of a late body may still be on its way: the connection
        // cannot carry another request.
        if self.status == StatusCode::REQUEST_TIMEOUT {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}
