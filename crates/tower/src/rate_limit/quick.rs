//! The layer's most common configuration, decided on the request where it stands: the
//! client address as the one key, a rate checked at once (no waiting mode, no challenge, no
//! outcome counting, no body key, lease or reservation). An admitted request goes on
//! without its head ever being taken apart; anything else (a refusal, a failure, a deny
//! list, a missing address) goes on to the general flow with what is known so far.
//!
//! Measured with `benches/instructions.sh`: taking the request apart and putting it back
//! (two copies of its few hundred bytes), the general flow's intermediate steps and the
//! key's move between them were 198 of the 1,785 instructions the layer added to an
//! admitted request without header fields.

use std::net::IpAddr;

use compact_str::CompactString;
use http::Request;
use http::request::Parts;
use sluice_core::Decision;
use sluice_limiter::{Decided, Error};

use super::config::{Config, try_now};
use super::decide::judged_now;
use super::flow::{Ctx, Step, decided};
use crate::filter::Admission;
use crate::key::ClientIp;
use crate::key::client_ip::peer_addr;

/// What the quick path found.
pub(super) enum Quick {
    /// Admitted and counted: call the inner service.
    Admit(Decision),
    /// Not limited: a method or route filter leaves it out, or the address is exempt.
    Pass,
    /// The limiter answered something else than a plain admission: its answer, with the
    /// address and its key, for the general flow's verdict (which needs the head).
    Judge(IpAddr, CompactString, Result<Decided, Error>),
    /// The general flow from the start (an unknown address, a denied one): nothing is
    /// recorded yet.
    Prepare,
    /// The store cannot answer at once: the async flow, from the start (nothing recorded).
    Slow,
}

/// Whether `config` takes the quick path.
pub(super) fn applies(config: &Config) -> bool {
    config.client_ip_only
        && !config.always_slow
        && config.outcomes.is_none()
        && config.wait_up_to.is_none()
        && config.challenge.is_none()
}

/// The filters, the client address and the check, on `request` in place. For a config
/// [`applies`] accepts.
pub(super) fn quick<B>(config: &Config, request: &mut Request<B>) -> Quick {
    if !config.filters.selects_head(request.method(), request.uri()) {
        return Quick::Pass;
    }
    let Some(peer) = peer_addr(request.extensions()) else {
        return Quick::Prepare;
    };
    let ip = config.client_ip.resolve(peer.ip(), request.headers());
    match config.filters.admission(Some(ip)) {
        Admission::Limit => {}
        Admission::Pass => {
            keep_address(config, request, ip);
            return Quick::Pass;
        }
        Admission::Forbid => return Quick::Prepare,
    }
    keep_address(config, request, ip);
    let key = config.client_ip.key_inline(ip);
    let selectors = [(config.keys[0].0.as_str(), key.as_str())];
    match try_now(&config.limiter, &config.policy, &selectors, 1, false) {
        None => Quick::Slow,
        Some(Ok(decided)) if decided.decision.allowed() && !decided.shadow_denied => {
            Quick::Admit(decided.decision)
        }
        Some(checked) => Quick::Judge(ip, key, checked),
    }
}

/// Leaves the resolved address in the request for the handlers, when asked.
fn keep_address<B>(config: &Config, request: &mut Request<B>, ip: IpAddr) {
    if config.client_ip_extension {
        request.extensions_mut().insert(ClientIp(ip));
    }
}

/// The general flow's step for the limiter's answer `checked` on the quick path.
pub(super) fn judged(
    config: &Config,
    parts: &mut Parts,
    client_ip: IpAddr,
    key: &str,
    checked: Result<Decided, Error>,
) -> Step {
    let ctx = Ctx {
        config,
        parts,
        client_ip: Some(client_ip),
        selectors: &[(config.keys[0].0.as_str(), key)],
    };
    decided(config, parts, Some(judged_now(&ctx, checked, false)), None)
}
