//! [`ReadBody`]: a request's whole body, read within `--read-timeout` and
//! `--max-body-bytes`, or the error the client is told.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;

use super::error::ApiError;
use super::routes::AppState;

/// The whole body of a request.
///
/// The deadline is one for the whole body, not one per read (tower-http's
/// `RequestBodyTimeout` restarts its timer at every frame): a client that
/// sends a byte every few seconds would otherwise hold its connection and
/// task for as long as it likes.
#[derive(Debug)]
pub(super) struct ReadBody(pub Bytes);

impl FromRequest<AppState> for ReadBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &AppState) -> Result<ReadBody, ApiError> {
        match tokio::time::timeout(s.read_timeout, Bytes::from_request(req, s)).await {
            Ok(Ok(body)) => Ok(ReadBody(body)),
            Ok(Err(r)) => Err(match r.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(s.max_body),
                _ => ApiError::bad_json(format!("cannot read the request body: {}", r.body_text())),
            }),
            Err(_elapsed) => Err(ApiError::body_timeout(s.read_timeout.as_secs())),
        }
    }
}
