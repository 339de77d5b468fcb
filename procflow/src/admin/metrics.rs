//! `GET /metrics`: the application's recorder, rendered on request ([`Admin::metrics`]).
//!
//! [`Admin::metrics`]: super::Admin::metrics

use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{MethodRouter, get};
use std::sync::Arc;

/// Renders every series the application's recorder holds, in Prometheus's text format.
pub(super) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Prometheus's text exposition format, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The route: `render`'s text, with the content type scrapers expect.
pub(super) fn route<S: Clone + Send + Sync + 'static>(render: Render) -> MethodRouter<S> {
    get(move || async move { ([(CONTENT_TYPE, TEXT_FORMAT)], render()).into_response() })
}
