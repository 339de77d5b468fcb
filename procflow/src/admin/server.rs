//! [`Admin`]: the router, and a helper that serves it on an address of its own.

use super::auth::{self, Access};
use super::{api, headers, log, metrics, page, summaries};
use crate::executor::Executor;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
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
    /// [`Admin::token`]'s, recorded as `admin`.
    token: Option<Arc<str>>,
    access: Access,
    addr: SocketAddr,
    /// [`Admin::metrics`]'s renderer.
    metrics: Option<metrics::Render>,
}

/// What the handlers share.
pub(super) struct Shared<E> {
    pub(super) executor: Executor<E>,
}

/// The largest body a mutation may send: its JSON is a name, a reason and a flag.
pub(super) const MAX_BODY: usize = 16 * 1024;

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
            access: Access::default(),
            addr: Self::DEFAULT_ADDR,
            metrics: None,
        }
    }

    /// Serves `GET /metrics`: whatever `render` returns, as Prometheus's text format.
    /// procflow itself records through the [`metrics`](https://docs.rs/metrics) facade
    /// and renders nothing; install the recorder you choose and hand over its renderer,
    /// for example `metrics-exporter-prometheus`'s `PrometheusHandle::render`:
    ///
    /// ```no_run
    /// # #[allow(dead_code)]
    /// # async fn run(executor: procflow::executor::Executor<()>) -> std::io::Result<()> {
    /// let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
    ///     .install_recorder()
    ///     .expect("no other recorder is installed");
    /// let server = procflow::admin::Admin::new(executor)
    ///     .metrics(move || prometheus.render())
    ///     .serve()
    ///     .await?;
    /// # drop(server);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// `/metrics` is a read: with a [`read_token`](Self::read_token) set, the scraper
    /// sends one (`authorization: bearer_token` in a Prometheus scrape config).
    #[must_use]
    pub fn metrics(mut self, render: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.metrics = Some(Arc::new(render));
        self
    }

    /// Allows mutations (abort, wake, bypass) to requests that carry `token` as
    /// `Authorization: Bearer <token>`; they are recorded as by `admin` (see
    /// [`named_token`](Self::named_token)). An empty token leaves this one unset.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        self.token = (!token.is_empty()).then(|| Arc::from(token));
        self
    }

    /// Allows mutations to requests that carry `token`, and records them (in the
    /// procedure's history and the audit log) as by `name`, whatever the request's
    /// body claims: a body's `by` that differs is kept beside it, as `name (as by)`.
    /// Give each operator, or each tool, a token of its own. Empty tokens are ignored.
    #[must_use]
    pub fn named_token(mut self, name: impl Into<String>, token: impl Into<String>) -> Self {
        let token = token.into();
        if !token.is_empty() {
            let name: Arc<str> = Arc::from(name.into());
            self.access.writers.push((name, Arc::from(token)));
        }
        self
    }

    /// Requires a token for reads too: `GET /api/…` then needs this token or a write
    /// token (the page asks for it; the page itself, which holds no data, stays open).
    /// Without one, reads are open to whoever reaches the address. Empty tokens are
    /// ignored.
    #[must_use]
    pub fn read_token(mut self, token: impl Into<String>) -> Self {
        let token = token.into();
        if !token.is_empty() {
            self.access.readers.push(Arc::from(token));
        }
        self
    }

    /// Adds names a request's `Host` may give (a name, or an address; without the port).
    /// Only loopback names (`localhost`, `127.0.0.1`, `[::1]`) are allowed by default,
    /// and [`serve`](Self::serve) adds the address it binds: a page on another site that
    /// points its own name at this machine (DNS rebinding) is refused with 421. Behind a
    /// proxy, allow the name the operators use.
    #[must_use]
    pub fn allow_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.access
            .hosts
            .extend(hosts.into_iter().map(|h| h.into().to_ascii_lowercase()));
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
        });
        let access = Arc::new(self.access());
        let mut reads = Router::new()
            .route("/api/summaries", get(summaries::list::<E>))
            .route("/api/procedures", get(api::list::<E>))
            .route("/api/procedures/{id}", get(api::record::<E>))
            .route("/api/procedures/{id}/diagram", get(api::diagram::<E>))
            .route("/api/catalog", get(api::catalog::<E>))
            .route("/api/locks", get(api::locks::<E>));
        if let Some(render) = &self.metrics {
            reads = reads.route("/metrics", metrics::route(Arc::clone(render)));
        }
        let reads = reads.route_layer(from_fn_with_state(Arc::clone(&access), auth::reads));
        // The token is checked before the body is read; the body is then size-limited.
        let writes = Router::new()
            .route("/api/procedures/{id}/abort", post(api::abort::<E>))
            .route("/api/procedures/{id}/bypass", post(api::bypass::<E>))
            .route("/api/events/{event}/wake", post(api::wake::<E>))
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .route_layer(from_fn_with_state(Arc::clone(&access), auth::writes));
        Router::new()
            .route("/", get(page::page))
            .merge(reads)
            .merge(writes)
            .fallback(api::unknown)
            .layer(from_fn_with_state(access, auth::hosts))
            .layer(from_fn(headers::security))
            .layer(from_fn(log::requests))
            .with_state(shared)
    }

    /// The hosts and tokens the router accepts.
    fn access(&self) -> Access {
        let mut access = self.access.clone();
        if let Some(token) = &self.token {
            access.writers.push((Arc::from("admin"), Arc::clone(token)));
        }
        access
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
    pub async fn serve(mut self) -> io::Result<AdminServer> {
        let listener = TcpListener::bind(self.addr).await?;
        if !self.addr.ip().is_unspecified() {
            // The address it is reached at, as a browser writes it.
            let host = match self.addr.ip() {
                std::net::IpAddr::V4(ip) => ip.to_string(),
                std::net::IpAddr::V6(ip) => format!("[{ip}]"),
            };
            self.access.hosts.push(host);
        }
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
