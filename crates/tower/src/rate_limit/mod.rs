//! The middleware itself: [`RateLimitLayer`] makes [`RateLimit`] services, whose
//! [`ResponseFuture`] decides each hit.

mod answer;
mod body;
mod challenge;
mod config;
mod decide;
mod flow;
mod future;
mod hold;
mod layer;
mod refusal;
mod service;

pub use body::ResponseBody;
pub use config::{LayerStats, WhenMissing};
pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use service::RateLimit;
