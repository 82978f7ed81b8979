//! Counting by outcome: a layer may count only the responses that match, e.g. failed
//! logins (401, 403), so successful users never use up their own limit.

use std::fmt;
use std::sync::Arc;

use http::StatusCode;

/// Which responses count against the policy.
#[derive(Clone)]
pub struct Outcomes(Arc<dyn Fn(StatusCode) -> bool + Send + Sync>);

impl Outcomes {
    /// Responses with one of these status codes.
    pub fn statuses(codes: impl IntoIterator<Item = u16>) -> Outcomes {
        let codes: Vec<u16> = codes.into_iter().collect();
        Outcomes(Arc::new(move |status| codes.contains(&status.as_u16())))
    }

    /// Responses for which `f` says yes.
    pub fn matching<F>(f: F) -> Outcomes
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        Outcomes(Arc::new(f))
    }

    pub fn matches(&self, status: StatusCode) -> bool {
        (self.0)(status)
    }
}

impl fmt::Debug for Outcomes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Outcomes(..)")
    }
}
