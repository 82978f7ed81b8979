//! Config reload: on SIGHUP and when a watched file changes (polled once a second, so no
//! platform watcher is needed). A bad new config is logged and rejected; the old one keeps
//! serving. Counters are kept: policies whose leaves are unchanged count where they were.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use sluice_limiter::Policy;

use crate::envoy::config::{self, EnvoyConfig};
use crate::service::Service;

/// Reads every config source; an error is one line naming the file.
pub type Loader = Box<dyn Fn() -> Result<(Vec<Policy>, EnvoyConfig), String> + Send + Sync>;

/// Loads the policies file through `policies` (if any) and the Envoy directory (if any).
pub fn loader(
    policies: impl Fn() -> Result<Vec<Policy>, String> + Send + Sync + 'static,
    envoy_dir: Option<PathBuf>,
) -> Loader {
    Box::new(move || {
        let list = policies()?;
        let envoy = match &envoy_dir {
            Some(dir) => config::load_dir(dir).map_err(|e| e.to_string())?,
            None => EnvoyConfig::default(),
        };
        Ok((list, envoy))
    })
}

/// Loads and installs the config; on error logs it and keeps the old one.
pub fn reload(service: &Service, load: &Loader) -> bool {
    let outcome = load()
        .and_then(|(policies, envoy)| service.replace(policies, envoy).map_err(|e| e.to_string()));
    match outcome {
        Ok(()) => {
            service.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
            tracing::info!(policies = service.limiter.policy_count(), "config reloaded");
            true
        }
        Err(error) => {
            service
                .metrics
                .reloads_failed
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(%error, "config reload rejected; the previous config keeps serving");
            false
        }
    }
}

/// Size and modification time of every file under `paths` (directories one level deep).
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    for path in paths {
        let mut files = vec![path.clone()];
        if path.is_dir()
            && let Ok(entries) = std::fs::read_dir(path)
        {
            files.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
        for file in files {
            if let Ok(meta) = std::fs::metadata(&file) {
                out.push((file, meta.len(), meta.modified().ok()));
            }
        }
    }
    out.sort();
    out
}

/// Starts reloading on SIGHUP and when anything under `watched` changes. The SIGHUP
/// handler is installed before this returns, so a SIGHUP sent once the service announces
/// itself reloads rather than kills it. Must be called within a Tokio runtime.
pub fn spawn(
    service: Arc<Service>,
    load: Loader,
    watched: Vec<PathBuf>,
) -> tokio::task::JoinHandle<()> {
    #[cfg(unix)]
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    #[cfg(not(unix))]
    let hangup = None::<()>;
    tokio::spawn(watch(service, load, watched, hangup))
}

#[cfg(unix)]
type Hangup = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangup = ();

async fn watch(
    service: Arc<Service>,
    load: Loader,
    watched: Vec<PathBuf>,
    #[cfg_attr(not(unix), allow(unused_mut, unused_variables))] mut hangup: Option<Hangup>,
) {
    let mut last = fingerprint(&watched);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hangup.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<()>();
        tokio::select! {
            () = signalled => {
                tracing::info!("SIGHUP: reloading config");
                last = fingerprint(&watched);
                reload(&service, &load);
            }
            _ = tick.tick() => {
                let now = fingerprint(&watched);
                if now != last {
                    last = now;
                    tracing::info!("config changed on disk: reloading");
                    reload(&service, &load);
                }
            }
        }
    }
}
