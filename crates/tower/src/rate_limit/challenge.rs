//! Challenges inside the layer: offering one with a denial, judging an answer, and
//! admitting a solved request within the ceiling.

use sha2::{Digest, Sha256};

use super::answer::{failed, render};
use super::config::{ChallengeConfig, Stats};
use super::flow::{Before, Ctx};
use crate::challenge::{Offer, Subject, Verification};
use crate::denied::{Denied, Reason};

pub(super) async fn verify(
    ctx: &Ctx<'_>,
    challenge: &ChallengeConfig,
    answer: &str,
) -> Verification {
    let digest = subject_digest(ctx.config.policy.name(), ctx.selectors);
    let subject = Subject {
        policy: ctx.config.policy.name(),
        digest: &digest,
        level: 0,
    };
    let verification = challenge.challenge.verify(answer, subject).await;
    if let Verification::Refused(_) = verification {
        Stats::bump(&ctx.config.stats.challenges_refused);
    }
    verification
}

/// The challenge for a refused client, unless it has reached the ceiling already (then
/// solving could not help it).
pub(super) async fn offer(ctx: &Ctx<'_>, challenge: &ChallengeConfig) -> Option<Offer> {
    let limiter = &ctx.config.limiter;
    let level = match limiter.peek(&challenge.ceiling, ctx.selectors, 1).await {
        // A peek reports what would remain after one more: the solved requests so far are
        // the rest.
        Ok(c) if c.decision.allowed() => c
            .decision
            .limit
            .saturating_sub(c.decision.remaining)
            .saturating_sub(1),
        Ok(_) => return None,
        Err(error) => {
            tracing::warn!(ceiling = %challenge.ceiling, %error, "no challenge offered");
            return None;
        }
    };
    let digest = subject_digest(ctx.config.policy.name(), ctx.selectors);
    Stats::bump(&ctx.config.stats.challenges_offered);
    Some(challenge.challenge.offer(Subject {
        policy: ctx.config.policy.name(),
        digest: &digest,
        level,
    }))
}

/// A correct answer: admitted if the ceiling admits it.
pub(super) async fn solved(ctx: &Ctx<'_>, challenge: &ChallengeConfig) -> Before {
    let config = ctx.config;
    let limiter = &config.limiter;
    Stats::bump(&config.stats.challenges_solved);
    match limiter.check(&challenge.ceiling, ctx.selectors, 1).await {
        Ok(checked) if checked.decision.allowed() => {
            if challenge.pardon
                && let Err(error) = limiter.reset(&config.policy, ctx.selectors).await
            {
                tracing::warn!(policy = %config.policy, %error, "could not pardon a solved challenge");
            }
            Before::Admit {
                decision: None,
                counted: false,
            }
        }
        Ok(checked) => {
            Stats::bump(&config.stats.denied);
            let denied = Denied {
                policy: &challenge.ceiling,
                reason: Reason::Ceiling,
                decision: Some(&checked.decision),
                client_ip: ctx.client_ip,
                selectors: ctx.selectors,
                request: ctx.parts,
                shadow: false,
                challenge: None,
                challenge_error: None,
            };
            Before::Answer(Box::new(render(config, &denied, &challenge.ceiling_fields)))
        }
        Err(error) => failed(ctx, &error),
    }
}

/// Binds a challenge to the policy and the client's selector values.
fn subject_digest(policy: &str, selectors: &[(&str, &str)]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(policy.as_bytes());
    for (name, value) in selectors {
        // Lengths first, so no two different lists hash alike.
        hash.update((name.len() as u64).to_be_bytes());
        hash.update(name.as_bytes());
        hash.update((value.len() as u64).to_be_bytes());
        hash.update(value.as_bytes());
    }
    hash.finalize().into()
}
