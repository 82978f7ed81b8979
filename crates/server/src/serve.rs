//! The service as a whole: [`Server::builder`] reads the config, opens the store and binds
//! the listeners; [`Server::run`] serves until a shutdown future completes, then drains.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_limiter::{DynStore, Limiter, PolicyError, Store};
use tokio::net::TcpListener;

use crate::http::UiAccess;
use crate::listener::{Limits, Listener};
use crate::reload::{self, LoadError, Sources};
use crate::service::Service;

/// How long a shutdown waits for the audit sinks to write what they hold.
const AUDIT_DRAIN: Duration = Duration::from_secs(3);
/// How often the memory store drops expired state, so idle identifiers free memory.
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// The near cache of a store in another process: denials remembered, and how late a reset
/// made by another server may be seen here.
const NEAR_CACHE_ENTRIES: usize = 100_000;
const NEAR_CACHE_TTL: Duration = Duration::from_secs(1);

/// Why the service could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// A config file is invalid (the message names the file, line and field).
    #[error(transparent)]
    Config(#[from] LoadError),
    /// The store URL is invalid or the store cannot be reached.
    #[error("--store: {0}")]
    Store(String),
    /// The policies cannot be used together (two Envoy limits made the same policy, say).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: SocketAddr,
        source: std::io::Error,
    },
    #[error("gRPC listener failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// An audit sink could not start (its file cannot be opened, say).
    #[error(transparent)]
    Audit(crate::audit::AuditError),
    /// The live page would show client identifiers to anyone on a public address.
    #[error(
        "--ui on {0} would show client identifiers to anyone who reaches it: give --ui-token, or listen on loopback"
    )]
    PublicUi(SocketAddr),
}

impl ServeError {
    /// Whether the user must fix the input (config, store URL) rather than the machine.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            ServeError::Config(_)
                | ServeError::Store(_)
                | ServeError::Policy(_)
                | ServeError::PublicUi(_)
                | ServeError::Audit(_)
        )
    }
}

enum StoreChoice {
    Url(String),
    Store(DynStore),
}

/// Configures a [`Server`]. Every listener but HTTP is optional.
pub struct ServerBuilder {
    sources: Sources,
    store: StoreChoice,
    http: SocketAddr,
    grpc: Option<SocketAddr>,
    resp: Option<SocketAddr>,
    envoy_modes: crate::EnvoyModes,
    http_limits: Option<Limits>,
    grpc_limits: Option<Limits>,
    resp_limits: Option<Limits>,
    reload_on_hangup: bool,
    reload_on_change: bool,
    ui: UiAccess,
    top: usize,
    refusals: usize,
}

impl ServerBuilder {
    /// Serves the live page (`GET /ui`) on the HTTP listener; off by default. An open page
    /// ([`UiAccess::Open`]) is refused at [`bind`](ServerBuilder::bind) unless the HTTP
    /// address is loopback: the page shows client identifiers.
    pub fn ui(mut self, access: UiAccess) -> Self {
        self.ui = access;
        self
    }

    /// The policies file (TOML), reloaded when it changes.
    pub fn policies_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.sources.policies = Some(path.into());
        self
    }

    /// A directory of envoyproxy/ratelimit YAML files, reloaded when they change.
    pub fn envoy_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.sources.envoy = Some(path.into());
        self
    }

    /// Where counters live, as a URL (`memory://`, `redis://...`, `memcached://...`; see
    /// [`open_store`](crate::open_store)). The default is `memory://`.
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store = StoreChoice::Url(url.into());
        self
    }

    /// Where counters live, as a store already made.
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = StoreChoice::Store(DynStore::new(store));
        self
    }

    /// The HTTP listener's address (`127.0.0.1:8080` by default; port 0 picks one).
    pub fn http(mut self, address: SocketAddr) -> Self {
        self.http = address;
        self
    }

    /// Also serve Envoy's rate limit service (gRPC) here.
    pub fn grpc(mut self, address: SocketAddr) -> Self {
        self.grpc = Some(address);
        self
    }

    /// Also serve the Redis protocol here.
    pub fn resp(mut self, address: SocketAddr) -> Self {
        self.resp = Some(address);
        self
    }

    /// Add `RateLimit-*`, `X-RateLimit-*` and `RateLimit` headers to Envoy answers.
    pub fn envoy_headers(mut self, on: bool) -> Self {
        self.envoy_modes.headers = on;
        self
    }

    /// Every Envoy answer setting at once (headers, global shadow and quota modes).
    pub fn envoy_modes(mut self, modes: crate::EnvoyModes) -> Self {
        self.envoy_modes = modes;
        self
    }

    /// Connection bounds and deadlines of the HTTP listener (see [`Server::http_limits`]).
    pub fn http_limits(mut self, limits: Limits) -> Self {
        self.http_limits = Some(limits);
        self
    }

    pub fn grpc_limits(mut self, limits: Limits) -> Self {
        self.grpc_limits = Some(limits);
        self
    }

    pub fn resp_limits(mut self, limits: Limits) -> Self {
        self.resp_limits = Some(limits);
        self
    }

    /// Reload the config on SIGHUP too (off by default: a program embedding the service
    /// may use the signal for itself; the `sluice` binary turns it on).
    pub fn reload_on_hangup(mut self, on: bool) -> Self {
        self.reload_on_hangup = on;
        self
    }

    /// Heavy hitters with `k` counters per policy, kind and minute (64 by default; 0 turns
    /// them off): see [`ServiceBuilder::top`](crate::ServiceBuilder::top).
    pub fn top(mut self, k: usize) -> Self {
        self.top = k;
        self
    }

    /// Remember the last `n` refusals (100 by default; 0 keeps none).
    pub fn refusals(mut self, n: usize) -> Self {
        self.refusals = n;
        self
    }

    /// Reload the config when a file of it changes (checked every second; on by default).
    pub fn reload_on_change(mut self, on: bool) -> Self {
        self.reload_on_change = on;
        self
    }

    /// Reads the config, opens the store and binds every listener. Must be called within a
    /// Tokio runtime.
    pub async fn bind(self) -> Result<Server, ServeError> {
        if self.ui == UiAccess::Open && !self.http.ip().is_loopback() {
            return Err(ServeError::PublicUi(self.http));
        }
        let loaded = self.sources.load()?;
        let (policies, envoy) = (loaded.policies, loaded.envoy);
        let store = match self.store {
            StoreChoice::Store(store) => store,
            StoreChoice::Url(url) => crate::store_url::open(&url)
                .await
                .map_err(ServeError::Store)?,
        };
        let all = policies.into_iter().chain(envoy.policies.iter().cloned());
        let mut limiter = Limiter::builder(store.clone()).policies(all);
        if store.is_remote() {
            // Clients already denied are answered here; a reset made by another server is
            // seen here within NEAR_CACHE_TTL at most.
            limiter = limiter.near_cache(NEAR_CACHE_ENTRIES, NEAR_CACHE_TTL);
        }
        let service = Arc::new(
            Service::builder(Arc::new(limiter.build()?))
                .envoy(envoy)
                .envoy_modes(self.envoy_modes)
                .top(self.top)
                .refusals(self.refusals)
                .ui(self.ui)
                .build(),
        );
        service
            .set_audit(loaded.audit.as_ref())
            .map_err(ServeError::Audit)?;
        let metrics = service.metrics();
        let http = Listener::new(
            bind(self.http).await?,
            self.http_limits.unwrap_or_else(Server::http_limits),
            "http",
            metrics.http.clone(),
        );
        let grpc = match self.grpc {
            Some(address) => Some(Listener::new(
                bind(address).await?,
                self.grpc_limits.unwrap_or_else(Server::grpc_limits),
                "grpc",
                metrics.grpc.clone(),
            )),
            None => None,
        };
        let resp = match self.resp {
            Some(address) => Some(Listener::new(
                bind(address).await?,
                self.resp_limits.unwrap_or_else(Server::resp_limits),
                "resp",
                metrics.resp.clone(),
            )),
            None => None,
        };
        // Installed before the listeners announce themselves, so an early SIGHUP reloads.
        let reloader = reload::spawn(
            service.clone(),
            self.sources,
            self.reload_on_hangup,
            self.reload_on_change,
        );
        let history = (*service.ui_access() != UiAccess::Off)
            .then(|| crate::http::spawn_history(service.clone()));
        Ok(Server {
            service,
            history,
            store,
            http,
            grpc,
            resp,
            reloader,
        })
    }
}

async fn bind(address: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(address)
        .await
        .map_err(|source| ServeError::Bind { address, source })
}

/// The service with its listeners bound, ready to [`run`](Server::run).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let dir = std::env::temp_dir().join(format!("sluice-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let policies = dir.join("sluice.toml");
/// std::fs::write(&policies, "[policies.api]\nrule = \"user:100/m\"\n").unwrap();
///
/// let server = sluice_server::Server::builder()
///     .policies_file(&policies)
///     .http("127.0.0.1:0".parse().unwrap())
///     .bind()
///     .await
///     .unwrap();
/// let address = server.http_addr(); // where clients connect
/// let service = server.service().clone(); // the same limiter, in this program
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let running = tokio::spawn(server.run(async { let _ = stopped.await; }));
/// let checked = service.check("api", &[("user", "alice")], 1).await.unwrap();
/// assert!(checked.decision.allowed());
/// # let _ = address;
/// stop.send(()).unwrap();
/// running.await.unwrap().unwrap();
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # });
/// ```
pub struct Server {
    service: Arc<Service>,
    store: DynStore,
    http: Listener,
    grpc: Option<Listener>,
    resp: Option<Listener>,
    reloader: tokio::task::JoinHandle<()>,
    /// Samples the counters for the live page, when it is on.
    history: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    pub fn builder() -> ServerBuilder {
        ServerBuilder {
            sources: Sources::default(),
            store: StoreChoice::Url("memory://".into()),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: None,
            resp: None,
            envoy_modes: crate::EnvoyModes::default(),
            http_limits: None,
            grpc_limits: None,
            resp_limits: None,
            reload_on_hangup: false,
            reload_on_change: true,
            ui: UiAccess::Off,
            top: crate::top::DEFAULT_CAPACITY,
            refusals: crate::top::DEFAULT_REFUSALS,
        }
    }

    /// The HTTP listener's defaults: a new connection sends its first byte within 5 s, and a
    /// connection that sends nothing for 60 s is closed (HTTP/2 peers are pinged every 20 s,
    /// so a live one always sends its acks).
    pub fn http_limits() -> Limits {
        Limits {
            max_connections: max_connections(),
            first_byte: Some(Duration::from_secs(5)),
            idle: Duration::from_secs(60),
        }
    }

    /// The gRPC listener's defaults, as HTTP's.
    pub fn grpc_limits() -> Limits {
        Server::http_limits()
    }

    /// The Redis protocol listener's defaults: no deadline for the first command (client
    /// pools connect ahead of need), closed after 5 minutes without one.
    pub fn resp_limits() -> Limits {
        Limits {
            max_connections: max_connections(),
            first_byte: None,
            idle: crate::resp::IDLE_TIMEOUT,
        }
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr()
    }

    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.as_ref().map(Listener::local_addr)
    }

    pub fn resp_addr(&self) -> Option<SocketAddr> {
        self.resp.as_ref().map(Listener::local_addr)
    }

    /// The service every listener answers from: decide on it in process, reload it.
    pub fn service(&self) -> &Arc<Service> {
        &self.service
    }

    /// Serves until `shutdown` completes, then stops accepting, lets open requests finish
    /// (up to 10 s) and returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let Server {
            service,
            store,
            http,
            grpc,
            resp,
            reloader,
            history,
        } = self;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            }
        };
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(grpc) = grpc {
            let (service, shutdown) = (service.clone(), until_stopped());
            tasks.spawn(async move { crate::grpc::serve(grpc, service, shutdown).await });
        }
        if let Some(resp) = resp {
            let (service, shutdown) = (service.clone(), until_stopped());
            tasks.spawn(async move {
                crate::resp::serve(resp, service, shutdown).await;
                Ok(())
            });
        }
        let sweeper = store.as_memory().cloned().map(|memory| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_EVERY);
                loop {
                    tick.tick().await;
                    memory.sweep();
                }
            })
        });
        tracing::info!(
            address = %http.local_addr(),
            policies = service.limiter().policy_count(),
            "serving"
        );
        service.set_ready(true);
        let ready = service.clone();
        tokio::spawn(async move {
            shutdown.await;
            ready.set_ready(false);
            let _ = stop.send(true);
        });
        crate::http::serve(http, crate::http::router(service.clone()), until_stopped()).await;
        let mut result = Ok(());
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Err(error)) if result.is_ok() => result = Err(error),
                Err(panicked) if result.is_ok() => {
                    tracing::error!(%panicked, "a listener task failed");
                }
                _ => {}
            }
        }
        reloader.abort();
        for task in sweeper.into_iter().chain(history) {
            task.abort();
        }
        // What the audit queues hold is written, unless a sink is stuck.
        service.close_audit(AUDIT_DRAIN).await;
        tracing::info!("shut down cleanly");
        result
    }
}

/// The default bound on each listener's connections: at most 10,000, and never so many that
/// three full listeners would take the file descriptors the store and the process need.
fn max_connections() -> usize {
    let soft = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(1024, |(soft, _)| soft);
    usize::try_from(soft.saturating_sub(256) / 4)
        .unwrap_or(usize::MAX)
        .clamp(16, 10_000)
}
