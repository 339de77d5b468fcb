//! Headers every answer carries: a Content-Security-Policy that lets the page run its own
//! script and styles and nothing else, and the usual hardening beside it.
//!
//! The page's script and style are inline (one document, no build step), and so is the
//! `<style>` of each diagram the page inserts; the policy allows exactly those by their
//! SHA-256 hashes. Anything injected (a procedure's data rendered into the page, a
//! compromised diagram) cannot run a script, load one, or send data anywhere but this
//! admin.

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// The policy, computed once from the page and the diagrams' style.
static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    let page = super::page::PAGE;
    let script = inline(page, "script");
    let style = inline(page, "style");
    let diagram = format!("\n{}", crate::operator::svg::STYLE);
    let policy = format!(
        "default-src 'none'; script-src {}; style-src {} {}; connect-src 'self'; \
         img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash(script),
        hash(style),
        hash(&diagram)
    );
    HeaderValue::from_str(&policy).expect("a policy is ASCII")
});

/// Middleware: adds the headers to every answer.
pub(super) async fn security(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, POLICY.clone());
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Never framed by another site (clickjacking of the buttons); `frame-ancestors` says
    // the same to browsers that read the policy.
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The text of the page's one inline `<tag>` element.
fn inline<'a>(page: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = page.find(&open).expect("the page has the element") + open.len();
    let end = start + page[start..].find(&close).expect("the element is closed");
    &page[start..end]
}

/// CSP's hash source for an inline element's text.
fn hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "'sha256-{}'",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_hashes_the_pages_script_and_styles_and_allows_nothing_else() {
        let policy = POLICY.to_str().unwrap();
        assert!(policy.starts_with("default-src 'none'; script-src 'sha256-"));
        assert_eq!(policy.matches("'sha256-").count(), 3, "{policy}");
        assert!(!policy.contains("unsafe"), "{policy}");
        // The page has one script and one style element: a second would be refused.
        assert_eq!(super::super::page::PAGE.matches("<script").count(), 1);
        assert_eq!(super::super::page::PAGE.matches("<style").count(), 1);
    }

    #[test]
    fn a_hash_is_sha256_in_base64() {
        // The SHA-256 of the empty string.
        assert_eq!(
            hash(""),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
    }
}
