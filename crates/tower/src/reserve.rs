//! Reservations on the layer: a cost known only once the response is (a language model's
//! tokens). The request is admitted or refused on an estimate; the response says what it
//! really cost, and the difference is refunded or charged as debt.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;

use crate::error::Error;

/// The actual cost of a response, put in its extensions by the app
/// (`response.extensions_mut().insert(ActualCost(1_532))`) for a layer with a
/// [`Reserve`]. It wins over a header named by [`Reserve::actual_header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActualCost(pub u64);

type EstimateFn = Arc<dyn Fn(&Parts) -> u64 + Send + Sync>;

#[derive(Clone)]
enum Estimate {
    Fixed(u64),
    By(EstimateFn),
}

/// Makes a layer reserve instead of check: each request is admitted or refused on its
/// estimated cost (as a check of that cost would be), and once the inner service's response
/// head is ready the reservation is settled at the actual cost the response reports
/// ([`ActualCost`] in its extensions, or a header named by [`actual_header`](Self::actual_header)):
/// a refund when it is less, debt that delays the next admissions when it is more (never a
/// refusal after the fact). A response that reports no actual cost, or an unreadable one,
/// keeps the estimate charged. Settling runs on a spawned task, never holding up the
/// response. Set on the layer with
/// [`RateLimitLayerBuilder::reserve`](crate::RateLimitLayerBuilder::reserve); the policy's
/// rule must hold rate leaves only.
///
/// ```
/// use sluice_tower::Reserve;
///
/// // The client says how many tokens it may use at most; 1,000 when it does not.
/// let reserve = Reserve::estimate(|request| {
///     request.headers.get("x-max-tokens")
///         .and_then(|v| v.to_str().ok()?.parse().ok())
///         .unwrap_or(1_000)
/// })
/// .actual_header("x-tokens-used");
/// # let _ = reserve;
/// ```
#[derive(Clone)]
pub struct Reserve {
    estimate: Estimate,
    header: Option<String>,
}

impl Reserve {
    /// Every request is estimated at `estimate` (0 charges nothing up front: the request is
    /// refused only when the limit is already reached, and pays its actual cost after).
    pub fn fixed(estimate: u64) -> Reserve {
        Reserve {
            estimate: Estimate::Fixed(estimate),
            header: None,
        }
    }

    /// The estimate comes from the request's head (its method, URI, headers, extensions).
    pub fn estimate<F>(estimate: F) -> Reserve
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        Reserve {
            estimate: Estimate::By(Arc::new(estimate)),
            header: None,
        }
    }

    /// The actual cost is also read from this response header (a decimal integer), when the
    /// response carries no [`ActualCost`] extension. The header is passed on to the client
    /// as it is. A name that is not a valid header name fails the layer's `build`.
    pub fn actual_header(mut self, name: &str) -> Reserve {
        self.header = Some(name.to_owned());
        self
    }

    /// Checked when the layer is built.
    pub(crate) fn validate(self) -> Result<ReserveConfig, Error> {
        let header = match self.header {
            Some(name) => Some(
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| Error::BadHeaderName(name))?,
            ),
            None => None,
        };
        Ok(ReserveConfig {
            estimate: self.estimate,
            header,
        })
    }
}

impl fmt::Debug for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Reserve");
        match &self.estimate {
            Estimate::Fixed(n) => s.field("estimate", n),
            Estimate::By(_) => s.field("estimate", &"Fn(&Parts) -> u64"),
        };
        s.field("actual_header", &self.header).finish()
    }
}

/// A [`Reserve`] checked by the layer's builder.
pub(crate) struct ReserveConfig {
    estimate: Estimate,
    header: Option<HeaderName>,
}

/// Why a response's actual cost could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoActual {
    /// The response reports none: the estimate stands.
    Absent,
    /// The header is there but not a decimal integer.
    Unreadable,
}

impl ReserveConfig {
    pub(crate) fn estimate(&self, request: &Parts) -> u64 {
        match &self.estimate {
            Estimate::Fixed(n) => *n,
            Estimate::By(f) => f(request),
        }
    }

    /// The actual cost the response head reports: the extension, else the header.
    pub(crate) fn actual(&self, head: &http::response::Parts) -> Result<u64, NoActual> {
        if let Some(ActualCost(cost)) = head.extensions.get::<ActualCost>() {
            return Ok(*cost);
        }
        let Some(value) = self.header.as_ref().and_then(|h| head.headers.get(h)) else {
            return Err(NoActual::Absent);
        };
        value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or(NoActual::Unreadable)
    }
}
