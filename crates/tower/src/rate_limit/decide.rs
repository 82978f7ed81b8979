//! The decision before the inner service runs: check (or peek, when counting by outcome),
//! wait if the layer waits, take a challenge answer, count a refused attempt, refuse.

use std::time::Duration;

use sluice_core::Decision;
use sluice_limiter::Decided;

use super::answer::{failed, refusal, unavailable};
use super::challenge::{offer, solved, verify};
use super::config::{Stats, try_now};
use super::flow::{Before, Ctx};
use crate::challenge::Verification;
use crate::denied::{Denied, Reason};

/// [`before`] without waiting, for the common case: no waiting mode, no challenge, and a
/// store that answers at once. `None` when the async path is needed; nothing is recorded
/// then.
pub(super) fn before_now(ctx: &Ctx<'_>) -> Option<Before> {
    let config = ctx.config;
    if config.wait_up_to.is_some() || config.challenge.is_some() {
        return None;
    }
    let peek = config.outcomes.is_some();
    let checked = try_now(&config.limiter, &config.policy, ctx.selectors, 1, peek)?;
    Some(judged_now(ctx, checked, peek))
}

/// The verdict of [`before_now`] on the limiter's answer `checked` (to a peek when `peek`).
pub(super) fn judged_now(
    ctx: &Ctx<'_>,
    checked: Result<Decided, sluice_limiter::Error>,
    peek: bool,
) -> Before {
    let checked = match checked {
        Ok(checked) => checked,
        Err(error) => return failed(ctx, &error),
    };
    if checked.decision.allowed() {
        return admit(ctx, checked, peek);
    }
    let Some(reason) = Reason::of(&checked.decision) else {
        return unavailable(ctx, &checked.decision);
    };
    let config = ctx.config;
    if peek && reason == Reason::Limited {
        // The store answered the peek at once, so it answers the count at once too.
        let counted = try_now(&config.limiter, &config.policy, ctx.selectors, 1, false);
        return match count_refused(ctx, checked.decision, counted) {
            Ok(admitted) => admitted,
            Err(decision) => refuse_with(ctx, decision, true, None, None),
        };
    }
    refuse_with(ctx, checked.decision, !peek, None, None)
}

/// An admitted hit: feeds the header fields, tells the audit hook about a shadow denial.
pub(super) fn admit(ctx: &Ctx<'_>, checked: Decided, peek: bool) -> Before {
    if checked.shadow_denied {
        shadow_denied(ctx, &checked.decision);
    }
    Before::Admit {
        decision: Some(checked.decision),
        counted: !peek,
    }
}

/// After a peek found the limit reached: what counting the refused attempt (`counted`)
/// says. `Ok` when the count was admitted after all (time passed), else the decision to
/// refuse with. A peek never strikes the penalty box, so the attempt is counted: repeated
/// abuse meets timeouts that double.
fn count_refused(
    ctx: &Ctx<'_>,
    peeked: Decision,
    counted: Option<Result<Decided, sluice_limiter::Error>>,
) -> Result<Before, Decision> {
    match counted {
        Some(Ok(checked)) if checked.decision.allowed() => Ok(Before::Admit {
            decision: Some(checked.decision),
            counted: true,
        }),
        Some(Ok(checked)) if Reason::of(&checked.decision).is_some() => Err(checked.decision),
        Some(Ok(_)) => Err(peeked),
        Some(Err(error)) => {
            tracing::warn!(policy = %ctx.config.policy, %error, "could not count a refused attempt");
            Err(peeked)
        }
        None => {
            tracing::warn!(policy = %ctx.config.policy, "could not count a refused attempt: the store did not answer at once");
            Err(peeked)
        }
    }
}

pub(super) async fn before(ctx: &Ctx<'_>) -> Before {
    let config = ctx.config;
    let limiter = &config.limiter;
    // Counting by outcome only peeks first; the hit is recorded once the outcome is known.
    let peek = config.outcomes.is_some();
    let mut waited = Duration::ZERO;
    loop {
        // A store in this process answers at once: no future to allocate.
        let result = match try_now(limiter, &config.policy, ctx.selectors, 1, peek) {
            Some(result) => result,
            None if peek => {
                (limiter.peek(&config.policy, ctx.selectors, 1).await).map(Decided::from)
            }
            None => (limiter.check(&config.policy, ctx.selectors, 1).await).map(Decided::from),
        };
        let checked = match result {
            Ok(checked) => checked,
            Err(error) => return failed(ctx, &error),
        };
        if checked.decision.allowed() {
            return admit(ctx, checked, peek);
        }
        if let (Some(max), Some(wait)) = (config.wait_up_to, checked.decision.retry_after())
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
            let result = limiter.check(&config.policy, ctx.selectors, 1).await;
            match count_refused(ctx, decision, Some(result.map(Decided::from))) {
                Ok(admitted) => return admitted,
                Err(refused) => decision = refused,
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
    let reason = Reason::of(&decision).unwrap_or(Reason::Limited);
    let offer = match &config.challenge {
        Some(challenge) if !config.shadow && reason != Reason::CostExceedsCapacity => {
            offer(ctx, challenge).await
        }
        _ => None,
    };
    refuse_with(
        ctx,
        decision,
        counted,
        challenge_error.as_deref(),
        offer.as_ref(),
    )
}

/// [`refuse`] once the challenge offer, if any, is made.
pub(super) fn refuse_with(
    ctx: &Ctx<'_>,
    decision: Decision,
    counted: bool,
    challenge_error: Option<&str>,
    offer: Option<&crate::challenge::Offer>,
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
    Stats::bump(&config.stats.denied);
    refusal(ctx, reason, decision, offer, challenge_error)
}

fn shadow_denied(ctx: &Ctx<'_>, decision: &Decision) {
    Stats::bump(&ctx.config.stats.shadow_denied);
    if let Some(audit) = &ctx.config.hooks.audit {
        audit(&Denied {
            policy: ctx.config.policy.name(),
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
