//! The query string of a store URL (`scheme://...?name=value&name=value`), read the same
//! way by every store and by the service: pairs split at the first `=` (a bare name has an
//! empty value), empty pairs skipped, no percent-decoding (store options are plain numbers
//! and paths).

/// Splits `url` at its first `?`: the part before, and the query's `(name, value)` pairs in
/// order.
pub fn split_query(url: &str) -> (&str, Vec<(&str, &str)>) {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let pairs = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .collect();
    (base, pairs)
}

/// Takes the parameters named in `ours` out of `url`: the URL with the others left on it,
/// in order, and the ones taken.
pub fn take_params<'a>(url: &'a str, ours: &[&str]) -> (String, Vec<(&'a str, &'a str)>) {
    let (base, pairs) = split_query(url);
    let (taken, kept): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(k, _)| ours.contains(k));
    if kept.is_empty() {
        return (base.to_owned(), taken);
    }
    let kept: Vec<String> = kept
        .iter()
        .map(|(k, v)| {
            if v.is_empty() {
                (*k).to_owned()
            } else {
                format!("{k}={v}")
            }
        })
        .collect();
    (format!("{base}?{}", kept.join("&")), taken)
}

/// `url` with the password of its user info hidden (`redis://u:***@host`), for messages
/// and logs. Everything before the last `@` may hold a secret: only a real scheme before
/// the first `://` and the user name after it are shown; anything else (a mistyped URL, an
/// `@` before the `://`) is hidden whole. Query options are the caller's to redact.
pub fn redact_user_info(url: &str) -> String {
    let Some(at) = url.rfind('@') else {
        return url.to_owned();
    };
    let hosts = &url[at + 1..];
    match url.split_once("://") {
        Some((scheme, rest))
            if scheme.len() < at
                && !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
        {
            let user = rest.split([':', '@']).next().unwrap_or("");
            format!("{scheme}://{user}:***@{hosts}")
        }
        _ => format!("***@{hosts}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_takes() {
        assert_eq!(split_query("memory://"), ("memory://", vec![]));
        assert_eq!(
            split_query("m://h?a=1&&b&c=x=y"),
            ("m://h", vec![("a", "1"), ("b", ""), ("c", "x=y")])
        );
        let (url, taken) = take_params(
            "redis://h:1/2?timeout_ms=5&db=3&tls_ca=/p",
            &["timeout_ms", "tls_ca"],
        );
        assert_eq!(url, "redis://h:1/2?db=3");
        assert_eq!(taken, vec![("timeout_ms", "5"), ("tls_ca", "/p")]);
        assert_eq!(take_params("r://h?a=1", &["a"]).0, "r://h");
    }
}
