//! The admin API and page (feature `admin`): what the `procflow` CLI shows and does, over
//! HTTP, for a running executor.
//!
//! [`Admin`] is an [axum](https://docs.rs/axum) router the application mounts beside its
//! own routes ([`Admin::router`]), or serves on an address of its own ([`Admin::serve`],
//! `127.0.0.1:7077` unless told otherwise). It serves one HTML page at `/` — a live table
//! of procedures, and for one procedure its diagram with the current state highlighted,
//! its history, children, locks and the operator's buttons — and the JSON endpoints the
//! page (and `procflow --url`) reads:
//!
//! | Method and path                  | Answer                                                  |
//! |----------------------------------|---------------------------------------------------------|
//! | `GET /api/summaries`             | one page of the list from memory: `?status=&machine=&state=&q=&order=asc\|desc&after=ID&limit=N&since=V&fresh=true`; rows (`id`, `parent`, `machine`, `state`, `status`, `steps`, `submitted_ms`, `updated_ms`, `detail`), counts per status and machine, `matched`, `next`, `version` (see below) |
//! | `GET /api/procedures`            | every [`ProcedureRecord`](crate::operator::ProcedureRecord), read from the store (the whole store: prefer `summaries` for a list); `?status=stuck&machine=job` filter |
//! | `GET /api/procedures/{id}`       | one record (404 if the store does not hold it), read by key, with `data`: the procedure's data as JSON (redacted as its machine says, `null` if it hides it) and `data_note` (why `data` is `null`) |
//! | `GET /api/procedures/{id}/diagram` | `{"mermaid": .., "svg": ..}`: its machine with its path drawn on it |
//! | `GET /api/catalog`               | the whole [`Catalog`](crate::operator::Catalog): records, machines, pending requests |
//! | `GET /api/locks`                 | `{"held": [{"id", "lock"}], "waiting": [ids]}`          |
//! | `POST /api/procedures/{id}/abort`  | roll it back; body `{"reason"}` (and optionally `"by"`) |
//! | `POST /api/procedures/{id}/bypass` | end it as bypassed; body `{"by", "reason", "recursive"}`, `reason` required |
//! | `POST /api/events/{event}/wake`  | wake the procedures suspended on `event`; body `{"by"}` |
//! | `GET /metrics`                   | with [`Admin::metrics`] only: the application's recorder, in Prometheus's text format |
//!
//! `GET /api/summaries` answers from one snapshot of the executor's memory, shared by
//! every request and rebuilt in the background when something changed: at most once a
//! second, and no more often than ten times the time a rebuild takes (a million
//! procedures: a few seconds), so polling pages take at most a tenth of a core from the
//! steps. With `since` equal to the list's current `version` the answer is
//! `{"version", "unchanged": true}` and costs a comparison. With `fresh=true` (what
//! `procflow --url list` sends) the answer has every change made before the request: a
//! snapshot is built then if the one in hand is older, whatever the rate limit. The text filter `q` looks in
//! ids, machine, state and status names, events and errors (ASCII letters without case).
//!
//! A `POST` carries out a durable [`Request`](crate::operator::Request) through
//! [`Executor::request`](crate::executor::Executor::request) and answers once it is done:
//! `{"outcome": "done", "procedures": n}`, or 409 with `{"outcome": "refused", "reason":
//! ..}`. Errors are `{"error": ..}` with 400 (bad input), 401 (no or wrong token), 403
//! (mutations disabled, or a read token), 404 (no such procedure), 413 (a body over 16
//! KiB), 421 (a host not allowed), 500 (the store) or 503 (the executor stopped).
//!
//! # Security
//!
//! - **Tokens.** Mutations need `Authorization: Bearer <token>` with a write token:
//!   [`Admin::token`] (recorded as by `admin`) or [`Admin::named_token`] (recorded as by
//!   its name, whatever the body's `by` claims). Without one every mutation is refused:
//!   the admin is read-only. Reads are open unless [`Admin::read_token`] is set; then
//!   they need a read or a write token. The token travels in a header, never a cookie, so
//!   another site the operator visits cannot make the browser send it.
//! - **Before the body.** The token is checked from the headers, before a mutation's body
//!   is read; bodies are limited to 16 KiB (413 beyond).
//! - **Hosts.** A request whose `Host` is not on the allow-list is refused with 421:
//!   loopback names by default, plus the address [`Admin::serve`] binds, plus
//!   [`Admin::allow_hosts`]. A page on another site that points its own name at this
//!   machine (DNS rebinding) reads nothing.
//! - **Content-Security-Policy.** Every answer allows only the page's own script and
//!   styles (by SHA-256 hash) and requests to this admin; it also says `nosniff`, no
//!   referrer and no framing.
//!
//! There is no TLS: keep the default loopback address, or put a TLS proxy in front (and
//! allow the name it forwards). Every HTTP request is logged through `tracing` (target
//! `procflow::admin`) with its method, path, status, time and peer; every mutation with
//! who asked (the token's name), why and what became of it.
//!
//! # Examples
//!
//! ```
//! # use procflow::prelude::*;
//! # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
//! # #[state_machine(procedure = Job)]
//! # enum JobState { #[initial] #[transition(to = [Done])] Wait, #[terminal] Done }
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Job;
//! # impl JobStateHandlers for Job {
//! #     async fn wait(&mut self, _: &Context<()>) -> Step<job_state::Wait> {
//! #         Ok(Flow::suspend("never"))
//! #     }
//! # }
//! use procflow::admin::Admin;
//! use procflow::executor::Executor;
//! use procflow_store::MemStore;
//! use std::sync::Arc;
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let executor = Executor::builder(Arc::new(MemStore::new()), ())
//!     .register::<JobState>()
//!     .start()
//!     .await?;
//! let id = executor.submit(Job).await?;
//!
//! // Port 0: any free port (the default is 127.0.0.1:7077).
//! let server = Admin::new(executor.clone())
//!     .token("s3cret")
//!     .bind("127.0.0.1:0".parse()?)
//!     .serve()
//!     .await?;
//! let url = format!("http://{}/api/procedures/{}", server.local_addr(), id.get());
//! let record: serde_json::Value = tokio::task::spawn_blocking(move || {
//!     ureq::get(&url).call()?.body_mut().read_json::<serde_json::Value>()
//! })
//! .await??;
//! assert_eq!(record["status"]["name"], "suspended");
//! server.shutdown().await?;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

mod api;
mod auth;
pub(crate) mod data;
mod error;
mod headers;
mod log;
mod metrics;
mod page;
mod server;
pub(crate) mod summaries;

pub use server::{Admin, AdminServer};
