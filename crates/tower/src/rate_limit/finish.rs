//! After the inner service: the outcome count (when the layer counts by outcome) and the
//! header fields of an admitted response.

use std::sync::Arc;

use http::Response;
use sluice_core::Decision;

use super::config::{Config, Stats};
use super::mode::LayerBody;

/// A response waiting for its outcome to be counted by a store that must be awaited.
pub(super) struct Unfinished<B> {
    decision: Option<Decision>,
    kept: Vec<String>,
    response: Response<B>,
}

/// The outcome count (when counting by outcome) and the header fields, when the count
/// needs no waiting; otherwise hands back what [`finish_later`] needs.
pub(super) fn finish_now<B, O: LayerBody<B>>(
    config: &Config,
    mut decision: Option<Decision>,
    kept: Option<Vec<String>>,
    response: Response<B>,
) -> Result<Response<O>, Box<Unfinished<B>>> {
    if let (Some(outcomes), Some(kept)) = (&config.outcomes, kept) {
        if outcomes.matches(response.status()) {
            let result =
                config
                    .limiter
                    .try_check_now(&config.policy, &outcome_selectors(config, &kept), 1);
            match result {
                Some(result) => counted_outcome(config, &mut decision, result),
                None => {
                    return Err(Box::new(Unfinished {
                        decision,
                        kept,
                        response,
                    }));
                }
            }
        } else if let Some(d) = &mut decision {
            // The peek reported what would remain after this hit; it was not counted.
            d.remaining = (d.remaining + 1).min(d.limit);
        }
    }
    Ok(decorate(config, decision.as_ref(), response))
}

/// [`finish_now`] for a store that must be awaited.
pub(super) async fn finish_later<B, O: LayerBody<B>>(
    config: Arc<Config>,
    unfinished: Box<Unfinished<B>>,
) -> Response<O> {
    let config = &*config;
    let Unfinished {
        mut decision,
        kept,
        response,
    } = *unfinished;
    let selectors = outcome_selectors(config, &kept);
    let result = config.limiter.check(&config.policy, &selectors, 1).await;
    counted_outcome(config, &mut decision, result);
    decorate(config, decision.as_ref(), response)
}

fn outcome_selectors<'a>(config: &'a Config, kept: &'a [String]) -> Vec<(&'a str, &'a str)> {
    config
        .keys
        .iter()
        .zip(kept)
        .map(|((name, _), value)| (name.as_str(), value.as_str()))
        .collect()
}

fn counted_outcome(
    config: &Config,
    decision: &mut Option<Decision>,
    result: Result<sluice_limiter::Checked, sluice_limiter::Error>,
) {
    match result {
        Ok(checked) => *decision = Some(checked.decision),
        Err(error) => {
            tracing::warn!(policy = %config.policy, %error, "could not count an outcome");
            Stats::bump(&config.stats.outcome_unrecorded);
        }
    }
}

/// Whether an admitted response needs [`finish_now`]: an outcome to count, or header fields
/// to write. Otherwise it is passed on as it is.
pub(super) fn needed(
    config: &Config,
    decision: Option<&Decision>,
    kept: Option<&[String]>,
) -> bool {
    kept.is_some() || (decision.is_some() && writes_fields(config))
}

/// Whether admitted responses carry header fields: not in shadow mode, and only the
/// policy's fields (`Retry-After` is for refusals).
fn writes_fields(config: &Config) -> bool {
    !config.shadow && (config.headers.ietf || config.headers.x_ratelimit)
}

/// The header fields, unless the layer is in shadow mode.
fn decorate<B, O: LayerBody<B>>(
    config: &Config,
    decision: Option<&Decision>,
    mut response: Response<B>,
) -> Response<O> {
    if let Some(decision) = decision
        && writes_fields(config)
    {
        config
            .fields
            .apply(response.headers_mut(), decision, false, config.headers);
    }
    response.map(O::inner)
}
