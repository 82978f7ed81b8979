//! The middleware itself: [`RateLimitLayer`] makes [`RateLimit`] services, whose
//! [`ResponseFuture`] decides each hit.

mod answer;
mod challenge;
mod config;
mod decide;
mod flow;
mod future;
mod layer;
mod service;

pub use config::{LayerStats, WhenMissing};
pub use future::{ResponseBody, ResponseFuture};
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use service::RateLimit;
