//! Mutations need the token: `Authorization: Bearer <token>`.

use super::error::ApiError;
use axum::http::{HeaderMap, StatusCode, header};

/// Checks the request's bearer token against `expected` (`None`: mutations disabled).
pub(super) fn check(expected: Option<&str>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(expected) = expected else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "mutations are disabled: this admin was started without a token (Admin::token)",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match given {
        Some(given) if same(given.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong token")),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "a mutation needs the admin token: send `Authorization: Bearer <token>`",
        )),
    }
}

/// Compares in time that depends on the lengths only, so the answer's timing does not
/// tell how many leading bytes of a guess were right.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!("Bearer {token}").parse().unwrap();
        headers.insert(header::AUTHORIZATION, value);
        headers
    }

    #[test]
    fn only_the_exact_token_passes() {
        assert!(check(Some("s3cret"), &bearer("s3cret")).is_ok());
        for wrong in ["s3cre", "s3cret!", "S3cret", ""] {
            let refused = check(Some("s3cret"), &bearer(wrong)).unwrap_err();
            assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{wrong:?}");
        }
        let missing = check(Some("s3cret"), &HeaderMap::new()).unwrap_err();
        assert_eq!(missing.status, StatusCode::UNAUTHORIZED);
        assert!(missing.message.contains("Authorization: Bearer"));
    }

    #[test]
    fn without_a_token_every_mutation_is_forbidden() {
        let refused = check(None, &bearer("anything")).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
    }
}
