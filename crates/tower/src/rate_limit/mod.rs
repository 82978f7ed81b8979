//! The middleware itself: [`RateLimitLayer`] makes [`RateLimit`] services, whose
//! [`ResponseFuture`] decides each hit.

mod answer;
mod body;
mod challenge;
mod config;
mod decide;
mod finish;
mod flow;
mod future;
mod hold;
mod layer;
mod mode;
mod quick;
mod refusal;
mod request;
mod service;

pub use body::ResponseBody;
pub use config::{LayerStats, WhenMissing};
pub use future::ResponseFuture;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
#[cfg(feature = "axum")]
pub use mode::Axum;
pub use mode::{BodyMode, LayerBody, Wrapped};
pub use service::RateLimit;
