//! [`Admin`]: the router, and a helper that serves it on an address of its own.

use super::{api, log, page};
use crate::executor::Executor;
use axum::Router;
use axum::routing::{get, post};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The admin API and page of one executor (see [the module](super)).
pub struct Admin<E> {
    executor: Executor<E>,
    token: Option<Arc<str>>,
    addr: SocketAddr,
}

/// What the handlers share.
pub(super) struct Shared<E> {
    pub(super) executor: Executor<E>,
    pub(super) token: Option<Arc<str>>,
}

impl<E: Send + Sync + 'static> Admin<E> {
    /// Where [`serve`](Self::serve) listens unless [`bind`](Self::bind) says otherwise:
    /// `127.0.0.1:7077`, reachable from this machine only.
    pub const DEFAULT_ADDR: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 7077);

    /// A read-only admin of `executor`: every mutation is refused until
    /// [`token`](Self::token) sets the token it needs.
    #[must_use]
    pub fn new(executor: Executor<E>) -> Self {
        Self {
            executor,
            token: None,
            addr: Self::DEFAULT_ADDR,
        }
    }

    /// Allows mutations (abort, wake, bypass) to requests that carry `token` as
    /// `Authorization: Bearer <token>`. An empty token leaves mutations disabled.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then(|| Arc::from(token));
        self
    }

    /// The address [`serve`](Self::serve) listens on. Anything but a loopback address
    /// exposes the page (and, with the token, the buttons) to the network without TLS:
    /// `serve` logs a warning.
    #[must_use]
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// The page and the API as a router, for the application to mount (`nest` it under
    /// a prefix, or `merge` it) and serve itself. Requests are logged; the peer's address
    /// is logged only if the application serves with
    /// `into_make_service_with_connect_info::<SocketAddr>()`.
    pub fn router(&self) -> Router {
        let shared = Arc::new(Shared {
            executor: self.executor.clone(),
            token: self.token.clone(),
        });
        Router::new()
            .route("/", get(page::page))
            .route("/api/procedures", get(api::list::<E>))
            .route("/api/procedures/{id}", get(api::record::<E>))
            .route("/api/procedures/{id}/diagram", get(api::diagram::<E>))
            .route("/api/procedures/{id}/abort", post(api::abort::<E>))
            .route("/api/procedures/{id}/bypass", post(api::bypass::<E>))
            .route("/api/events/{event}/wake", post(api::wake::<E>))
            .route("/api/catalog", get(api::catalog::<E>))
            .route("/api/locks", get(api::locks::<E>))
            .fallback(api::unknown)
            .layer(axum::middleware::from_fn(log::requests))
            .with_state(shared)
    }

    /// Serves [`router`](Self::router) on the [`bind`](Self::bind) address (by default
    /// [`DEFAULT_ADDR`](Self::DEFAULT_ADDR)) until [`AdminServer::shutdown`] or until the
    /// `AdminServer` is dropped.
    ///
    /// # Errors
    ///
    /// Binding the address failed (in use, not permitted).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped before it returns, nothing is served.
    pub async fn serve(self) -> io::Result<AdminServer> {
        let listener = TcpListener::bind(self.addr).await?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() {
            tracing::warn!(
                target: "procflow::admin",
                %addr,
                "the admin page is served beyond this machine, without TLS"
            );
        }
        let app = self
            .router()
            .into_make_service_with_connect_info::<SocketAddr>();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                // Sent, or the AdminServer dropped: either way, stop.
                let _ = stopped.await;
            };
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        });
        tracing::info!(target: "procflow::admin", %addr, "admin page served");
        Ok(AdminServer {
            addr,
            stop: Some(stop),
            task,
        })
    }
}

/// A running [`Admin::serve`]. Dropping it stops the server too (without waiting).
#[derive(Debug)]
pub struct AdminServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl AdminServer {
    /// The address it listens on (the port the system chose, for port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections and waits for the requests in flight to be answered.
    ///
    /// # Errors
    ///
    /// The server's I/O error, if it failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the server stopping in the background.
    pub async fn shutdown(mut self) -> io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(served) => served,
            Err(panicked) => Err(io::Error::other(panicked)),
        }
    }
}
