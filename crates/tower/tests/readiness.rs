//! The layer keeps tower's readiness contract: the inner service is called on the very
//! instance that was polled ready, whether the hit is decided in `call` (a store in this
//! process) or in the response future (a wait mode). A service that tells its instances
//! apart panics otherwise.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Key, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

/// Ready only once polled so; a clone starts not ready, as a clone of a service that
/// reserves capacity in `poll_ready` (tower's `ConcurrencyLimit`) does.
struct Strict {
    ready: bool,
    calls: Arc<AtomicUsize>,
}

impl Clone for Strict {
    fn clone(&self) -> Self {
        Strict {
            ready: false,
            calls: self.calls.clone(),
        }
    }
}

impl Service<Request<Full<Bytes>>> for Strict {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Full<Bytes>>) -> Self::Future {
        assert!(self.ready, "called on an instance not polled ready");
        self.ready = false;
        self.calls.fetch_add(1, Ordering::SeqCst);
        ready(Ok(Response::new(Full::new(Bytes::from("ok")))))
    }
}

fn request() -> Request<Full<Bytes>> {
    Request::get("/")
        .header("x-user", "alice")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test]
async fn the_inner_service_is_called_on_the_instance_polled_ready() {
    let builder = || {
        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new("api", "user:3/m").unwrap())
            .build()
            .unwrap();
        RateLimitLayer::builder(Arc::new(limiter), "api")
            .selector("user", Key::header(http::HeaderName::from_static("x-user")))
    };
    let decided_in_call = builder().build().unwrap();
    // A wait mode decides in the response future, the inner instance moved into it.
    let decided_later = builder()
        .wait_up_to(Duration::from_millis(1))
        .build()
        .unwrap();
    for layer in [decided_in_call, decided_later] {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut service = layer.layer(Strict {
            ready: false,
            calls: calls.clone(),
        });
        for _ in 0..2 {
            let response = service
                .ready()
                .await
                .unwrap()
                .call(request())
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
        }
        // The service, cloned as servers clone it per connection, keeps the contract too.
        let response = service.clone().oneshot(request()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
