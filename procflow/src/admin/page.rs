//! The page: one HTML document with its style and a small script, no build step. It
//! polls the JSON endpoints with relative URLs, so it works wherever the router is
//! mounted (under a prefix, link to it with a trailing slash: `/procflow/`).

use axum::http::header;
use axum::response::IntoResponse;

pub(super) const PAGE: &str = include_str!("page.html");

pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
