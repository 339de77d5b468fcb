//! How the API answers a failure: a status code and `{"error": ..}`.

use crate::executor::ExecutorError;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// A failed API call.
#[derive(Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(super) fn not_found(id: u64) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("the store holds no procedure #{id}"),
        )
    }
}

impl From<ExecutorError> for ApiError {
    fn from(error: ExecutorError) -> Self {
        let status = match &error {
            ExecutorError::NotFound(_) => StatusCode::NOT_FOUND,
            ExecutorError::Store(_) | ExecutorError::Metadata { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            // Stopped, killed, fenced, shut down: this executor can do nothing more.
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, error.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message });
        (self.status, Json(body)).into_response()
    }
}
