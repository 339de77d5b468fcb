//! Who may ask what: the `Host` a request names, and its bearer token
//! (`Authorization: Bearer <token>`). Each check is a middleware, so it runs before the
//! handler reads the body: a request that may not mutate learns nothing of its body's
//! faults and costs no more than its headers.

use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The hosts and tokens an admin accepts.
#[derive(Clone, Debug)]
pub(super) struct Access {
    /// Write tokens, with the name a mutation by each is recorded under.
    pub(super) writers: Vec<(Arc<str>, Arc<str>)>,
    /// Read tokens. With none, reads are open; with one, a read needs a read or a write
    /// token.
    pub(super) readers: Vec<Arc<str>>,
    /// The `Host` names (lower case, without a port) requests may name.
    pub(super) hosts: Vec<String>,
}

/// The loopback names: what a browser on this machine sends for the default address.
pub(super) const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

impl Default for Access {
    fn default() -> Self {
        Self {
            writers: Vec::new(),
            readers: Vec::new(),
            hosts: LOOPBACK_HOSTS.iter().map(|&h| h.to_owned()).collect(),
        }
    }
}

/// Who a mutation is recorded as: the name of the token it carried.
#[derive(Clone, Debug)]
pub(super) struct Actor(pub(super) Arc<str>);

/// Middleware: refuses a request whose `Host` is not on the allow-list. A page on
/// another site that makes its own name resolve to this machine (DNS rebinding) sends
/// its own name: it cannot read the catalog.
pub(super) async fn hosts(
    State(access): State<Arc<Access>>,
    request: Request,
    next: Next,
) -> Response {
    let named = request
        .headers()
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match named.map(host_name) {
        Some(host) if access.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) => {
            next.run(request).await
        }
        Some(host) => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "host `{host}` is not served here: allow it with Admin::allow_hosts \
                 (loopback names are allowed by default)"
            ),
        )
        .into_response(),
        None => ApiError::new(StatusCode::BAD_REQUEST, "the request names no host").into_response(),
    }
}

/// `host[:port]` → `host` (an IPv6 literal keeps its brackets).
fn host_name(authority: &str) -> &str {
    if let Some(end) = authority.strip_prefix('[').and_then(|rest| rest.find(']')) {
        return &authority[..end + 2];
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
}

/// Middleware: reads need a read or write token once a read token is set.
pub(super) async fn reads(
    State(access): State<Arc<Access>>,
    request: Request,
    next: Next,
) -> Response {
    if access.readers.is_empty() {
        return next.run(request).await;
    }
    let given = bearer(request.headers());
    let known = access
        .readers
        .iter()
        .chain(access.writers.iter().map(|(_, t)| t));
    match given {
        Some(given) if known.into_iter().any(|t| same(given, t)) => next.run(request).await,
        Some(_) => ApiError::new(StatusCode::UNAUTHORIZED, "wrong token").into_response(),
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "reading needs a token: send `Authorization: Bearer <token>`",
        )
        .into_response(),
    }
}

/// Middleware: a mutation needs a write token; the handler learns its name ([`Actor`]).
pub(super) async fn writes(
    State(access): State<Arc<Access>>,
    mut request: Request,
    next: Next,
) -> Response {
    match writer(&access, request.headers()) {
        Ok(name) => {
            request.extensions_mut().insert(Actor(name));
            next.run(request).await
        }
        Err(refused) => refused.into_response(),
    }
}

/// The name of the write token `headers` carry.
fn writer(access: &Access, headers: &HeaderMap) -> Result<Arc<str>, ApiError> {
    if access.writers.is_empty() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "mutations are disabled: this admin was started without a token (Admin::token)",
        ));
    }
    let Some(given) = bearer(headers) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a mutation needs the admin token: send `Authorization: Bearer <token>`",
        ));
    };
    // Every token is compared, so the time taken does not tell which one came close.
    let mut found = None;
    for (name, token) in &access.writers {
        if same(given, token) {
            found = Some(Arc::clone(name));
        }
    }
    found.ok_or_else(|| {
        let read_only = access.readers.iter().any(|t| same(given, t));
        if read_only {
            ApiError::new(StatusCode::FORBIDDEN, "this token may read, not mutate")
        } else {
            ApiError::new(StatusCode::UNAUTHORIZED, "wrong token")
        }
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

/// Compares in time that depends on the lengths only, so the answer's timing does not
/// tell how many leading bytes of a guess were right.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer_of(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(header::AUTHORIZATION, value);
        headers
    }

    fn access(writers: &[(&str, &str)], readers: &[&str]) -> Access {
        Access {
            writers: writers
                .iter()
                .map(|&(n, t)| (Arc::from(n), Arc::from(t)))
                .collect(),
            readers: readers.iter().map(|&t| Arc::from(t)).collect(),
            ..Access::default()
        }
    }

    #[test]
    fn only_an_exact_write_token_passes_and_names_its_holder() {
        let access = access(&[("admin", "s3cret"), ("alice", "al1ce")], &["r3ad"]);
        assert_eq!(&*writer(&access, &bearer_of("s3cret")).unwrap(), "admin");
        assert_eq!(&*writer(&access, &bearer_of("al1ce")).unwrap(), "alice");
        for wrong in ["s3cre", "s3cret!", "S3cret", ""] {
            let refused = writer(&access, &bearer_of(wrong)).unwrap_err();
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
        }
        let missing = writer(&access, &HeaderMap::new()).unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
        assert!(missing.message.contains("Authorization: Bearer"));
        let read_only = writer(&access, &bearer_of("r3ad")).unwrap_err();
        assert_eq!(read_only.status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn without_a_write_token_every_mutation_is_forbidden() {
        let refused = writer(&access(&[], &[]), &bearer_of("anything")).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
    }

    #[test]
    fn host_names_lose_their_port_and_keep_ipv6_brackets() {
        assert_eq!(host_name("localhost:7077"), "localhost");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:7077"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("admin.example.com:443"), "admin.example.com");
    }
}
