//! The decision before the inner service runs: check (or peek, when counting by outcome),
//! wait if the layer waits, take a challenge answer, count a refused attempt, refuse.

use std::time::Duration;

use sluice_core::Decision;

use super::answer::{answer, failed, unavailable};
use super::challenge::{offer, solved, verify};
use super::config::Stats;
use super::flow::{Before, Ctx};
use crate::challenge::Verification;
use crate::denied::{Denied, Reason};

pub(super) async fn before(ctx: &Ctx<'_>) -> Before {
    let config = ctx.config;
    let limiter = &config.limiter;
    // Counting by outcome only peeks first; the hit is recorded once the outcome is known.
    let peek = config.outcomes.is_some();
    let mut waited = Duration::ZERO;
    loop {
        // A store in this process answers at once: no future to allocate.
        let result = match limiter.try_now(&config.policy, ctx.selectors, 1, peek) {
            Some(result) => result,
            None if peek => limiter.peek(&config.policy, ctx.selectors, 1).await,
            None => limiter.check(&config.policy, ctx.selectors, 1).await,
        };
        let checked = match result {
            Ok(checked) => checked,
            Err(error) => return failed(ctx, &error),
        };
        if checked.decision.allowed {
            if checked.shadow_denied {
                shadow_denied(ctx, &checked.decision);
            }
            return Before::Admit {
                decision: Some(checked.decision),
                counted: !peek,
            };
        }
        if let (Some(max), Some(wait)) = (config.wait_up_to, checked.decision.retry_after)
            && waited + wait <= max
        {
            tokio::time::sleep(wait).await;
            waited += wait;
            continue;
        }
        let Some(reason) = Reason::of(&checked.decision) else {
            return unavailable(ctx, &checked.decision);
        };
        // An answer is only spent when it is needed: a client with room left keeps it.
        let mut challenge_error = None;
        if let Some(challenge) = &config.challenge
            && reason != Reason::CostExceedsCapacity
            && let Some(answer) = challenge.challenge.answer(ctx.parts)
        {
            match verify(ctx, challenge, answer).await {
                Verification::Solved => return solved(ctx, challenge).await,
                Verification::Refused(why) => challenge_error = Some(why),
            }
        }
        let mut decision = checked.decision;
        let mut counted = !peek;
        if peek && reason == Reason::Limited {
            // A peek never strikes the penalty box: count the refused attempt, so repeated
            // abuse meets timeouts that double.
            match limiter.check(&config.policy, ctx.selectors, 1).await {
                Ok(checked) if checked.decision.allowed => {
                    return Before::Admit {
                        decision: Some(checked.decision),
                        counted: true,
                    };
                }
                Ok(checked) if Reason::of(&checked.decision).is_some() => {
                    decision = checked.decision;
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(policy = %config.policy, %error, "could not count a refused attempt");
                }
            }
            counted = true;
        }
        return refuse(ctx, decision, counted, challenge_error).await;
    }
}

/// A policy denial: the answer, unless the layer is in shadow mode.
async fn refuse(
    ctx: &Ctx<'_>,
    decision: Decision,
    counted: bool,
    challenge_error: Option<String>,
) -> Before {
    let config = ctx.config;
    if config.shadow {
        shadow_denied(ctx, &decision);
        return Before::Admit {
            decision: None,
            counted,
        };
    }
    let reason = Reason::of(&decision).unwrap_or(Reason::Limited);
    let offer = match &config.challenge {
        Some(challenge) if reason != Reason::CostExceedsCapacity => offer(ctx, challenge).await,
        _ => None,
    };
    Stats::bump(&config.stats.denied);
    Before::Answer(answer(
        ctx,
        reason,
        Some(&decision),
        offer.as_ref(),
        challenge_error.as_deref(),
    ))
}

fn shadow_denied(ctx: &Ctx<'_>, decision: &Decision) {
    Stats::bump(&ctx.config.stats.shadow_denied);
    if let Some(audit) = &ctx.config.hooks.audit {
        audit(&Denied {
            policy: &ctx.config.policy,
            reason: Reason::of(decision).unwrap_or(Reason::Limited),
            decision: Some(decision),
            client_ip: ctx.client_ip,
            selectors: ctx.selectors,
            request: ctx.parts,
            shadow: true,
            challenge: None,
            challenge_error: None,
        });
    }
}
