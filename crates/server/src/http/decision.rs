//! The JSON shape of a decision, shared by the policy API and the `check` and `simulate`
//! commands.

use serde_json::{Value, json};
use sluice_limiter::Checked;

/// A decision as JSON, under the policy it was made under: times in seconds (fractional);
/// `retry_after` is null when allowed, and also when the cost can never be admitted
/// (`denial` then says `cost_exceeds_capacity`).
pub fn decision_json(checked: &Checked) -> Value {
    let d = &checked.decision;
    let policy = &checked.policy;
    json!({
        "allowed": d.allowed(),
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_after": d.reset_after.as_secs_f64(),
        "retry_after": d.retry_after().map(|r| r.as_secs_f64()),
        "denial": d.denial.map(|r| r.name()),
        "policy": policy.name(),
        "leaf": policy.leaves.get(d.leaf).map(|l| l.leaf.to_string()),
        "shadow_denied": checked.shadow_denied,
    })
}
