//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC (tonic).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tonic::{Request, Response, Status};

use super::decide::{Code, EnvoyDescriptor, EnvoyError, EnvoyRequest, EnvoyResponse};
use crate::service::Service;

/// Largest gRPC message accepted.
pub const MAX_MESSAGE: usize = 64 * 1024;

/// The tonic service over `service`.
pub fn server(service: Arc<Service>) -> RateLimitServiceServer<Rls> {
    RateLimitServiceServer::new(Rls(service)).max_decoding_message_size(MAX_MESSAGE)
}

/// Answers `ShouldRateLimit`.
pub struct Rls(Arc<Service>);

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = from_proto(request.into_inner());
        match self.0.should_rate_limit(&request).await {
            Ok(response) => Ok(Response::new(to_proto(response))),
            Err(EnvoyError::Invalid(m)) => Err(Status::invalid_argument(m)),
            Err(e) => Err(Status::unavailable(e.to_string())),
        }
    }
}

fn from_proto(request: RateLimitRequest) -> EnvoyRequest {
    EnvoyRequest {
        domain: request.domain,
        hits_addend: request.hits_addend,
        descriptors: request
            .descriptors
            .into_iter()
            .map(|d| EnvoyDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit: d.limit.map(|l| (l.requests_per_unit, l.unit)),
                hits_addend: d.hits_addend.map(|h| h.value),
            })
            .collect(),
    }
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => 1,
        Code::OverLimit => 2,
    }
}

fn to_proto(response: EnvoyResponse) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(response.overall_code),
        statuses: response
            .statuses
            .into_iter()
            .map(|s| DescriptorStatus {
                code: code(s.code),
                current_limit: s.current_limit.map(|l| RateLimit {
                    name: l.name,
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|d| ProtoDuration {
                    seconds: d.as_secs() as i64,
                    nanos: d.subsec_nanos() as i32,
                }),
                ..Default::default()
            })
            .collect(),
        response_headers_to_add: response
            .headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}
