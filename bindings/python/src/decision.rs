//! `Decision`: one hit's answer as Python reads it.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sluice_limiter::Checked;

/// A refusal as Python receives it: `(status, headers, body)`.
type Refusal<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

/// A decision: admitted or not, with the numbers a client needs. It holds the Rust answer
/// and reads each field when asked: most callers look at `allowed` only, so nothing is
/// formatted or copied for the others.
#[pyclass(frozen, module = "sluice", name = "Decision")]
pub struct Decision {
    checked: Checked,
}

impl Decision {
    pub fn new(checked: Checked) -> Decision {
        Decision { checked }
    }

    /// `allowed`, for the answers that carry a decision.
    pub(crate) fn is_allowed(&self) -> bool {
        self.checked.decision.allowed()
    }
}

#[pymethods]
impl Decision {
    /// Whether the hit was admitted (a shadow policy always admits: see `shadow_denied`).
    #[getter]
    fn allowed(&self) -> bool {
        self.checked.decision.allowed()
    }

    /// Hits of cost 1 still admissible: after this hit if admitted, now if denied.
    #[getter]
    fn remaining(&self) -> u64 {
        self.checked.decision.remaining
    }

    /// The deciding leaf's capacity (the burst for GCRA, the count otherwise).
    #[getter]
    fn limit(&self) -> u64 {
        self.checked.decision.limit
    }

    /// Seconds until the same hit would pass, when denied and known.
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.checked.decision.retry_after().map(|r| r.as_secs_f64())
    }

    /// Seconds until the deciding leaf is back to full capacity.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.checked.decision.reset_after.as_secs_f64()
    }

    /// The deciding leaf as rule text, e.g. `ip+user:5/m`.
    #[getter]
    fn leaf(&self) -> String {
        self.checked.leaf().leaf.to_string()
    }

    /// Why it was denied: `limited`, `penalized`, `cost_exceeds_capacity`,
    /// `store_unavailable`; `None` when admitted.
    #[getter]
    fn denial(&self) -> Option<&'static str> {
        self.checked.decision.denial.map(|denial| denial.name())
    }

    /// A shadow policy would have denied this hit.
    #[getter]
    fn shadow_denied(&self) -> bool {
        self.checked.shadow_denied
    }

    /// Answered by the near cache without asking the store.
    #[getter]
    fn cached(&self) -> bool {
        self.checked.cached
    }

    /// The store could not decide; the policy's failure mode (`open`, `closed`, `local`) did.
    #[getter]
    fn without_store(&self) -> Option<&'static str> {
        self.checked.without_store.map(|mode| mode.name())
    }

    /// The policy's name.
    #[getter]
    fn policy(&self) -> &str {
        self.checked.policy.name()
    }

    /// The response header fields for this decision, as the tower layer writes them:
    /// `Retry-After` (denied only), the IETF `RateLimit-Policy` and `RateLimit`, and with
    /// `x_ratelimit=True` the `X-RateLimit-Limit/Remaining/Reset` trio.
    #[pyo3(signature = (*, retry_after = true, ietf = true, x_ratelimit = false))]
    fn headers(&self, retry_after: bool, ietf: bool, x_ratelimit: bool) -> Vec<(String, String)> {
        let which = sluice_tower::Headers {
            retry_after,
            ietf,
            x_ratelimit,
        };
        let fields = sluice_tower::header_fields(
            &self.checked.policy,
            &self.checked.decision,
            !self.checked.decision.allowed(),
            which,
        );
        pairs(&fields)
    }

    /// The default answer to this denial, as the tower layer gives it: `(status, headers,
    /// body)` with 429 and an RFC 9457 problem+json body (503 when the store could not
    /// decide and the policy fails closed), header fields as `headers` writes them. `None`
    /// when the decision admits.
    #[pyo3(signature = (*, retry_after = true, ietf = true, x_ratelimit = false))]
    fn refusal<'py>(
        &self,
        py: Python<'py>,
        retry_after: bool,
        ietf: bool,
        x_ratelimit: bool,
    ) -> Option<Refusal<'py>> {
        let which = sluice_tower::Headers {
            retry_after,
            ietf,
            x_ratelimit,
        };
        let response = sluice_tower::refusal(&self.checked.policy, &self.checked.decision, which)?;
        let headers = pairs(response.headers());
        let body = PyBytes::new(py, response.body());
        Some((response.status().as_u16(), headers, body))
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    fn __repr__(&self) -> String {
        let mut out = format!(
            "Decision(allowed={}, remaining={}, limit={}, leaf={:?}, policy={:?}",
            if self.allowed() { "True" } else { "False" },
            self.remaining(),
            self.limit(),
            self.leaf(),
            self.policy()
        );
        if let Some(denial) = self.denial() {
            out.push_str(&format!(", denial={denial:?}"));
        }
        if let Some(retry) = self.retry_after() {
            out.push_str(&format!(", retry_after={retry}"));
        }
        out.push(')');
        out
    }
}

fn pairs(fields: &http::HeaderMap) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (canonical(name.as_str()), value)
        })
        .collect()
}

/// `ratelimit-policy` as `RateLimit-Policy`: the spelling of the specifications, which
/// frameworks pass on as given (HTTP field names are case-insensitive).
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|word| match word {
            "ratelimit" => "RateLimit".to_owned(),
            "x" => "X".to_owned(),
            _ => {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}
