//! One `tracing` event per HTTP request: method, path, status, time taken and peer.

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::Response;
use std::net::SocketAddr;
use std::time::Instant;

/// Middleware: logs the request once it is answered.
pub(super) async fn requests(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    // Present when served by `Admin::serve`; an application that mounts the router
    // provides it only if it serves with connect info.
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    tracing::info!(
        target: "procflow::admin",
        %method,
        path,
        status = response.status().as_u16(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        peer = peer.as_deref().unwrap_or("-"),
        "admin request"
    );
    response
}
