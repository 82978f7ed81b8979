//! Config reload: on SIGHUP and when a watched file changes (polled once a second, so no
//! platform watcher is needed). A bad new config is logged and rejected; the old one keeps
//! serving. Counters are kept: policies whose leaves are unchanged count where they were.
//! A changed `[audit]` table takes effect too: new sinks start, the old ones finish.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice_limiter::Policy;

use crate::audit::AuditConfig;
use crate::config::{self, ConfigError};
use crate::envoy::config::{self as envoy_config, EnvoyConfig, EnvoyConfigError};
use crate::service::Service;

/// Where the service's config comes from: a policies file (TOML) and a directory of
/// envoyproxy/ratelimit YAML files, each optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub policies: Option<PathBuf>,
    pub envoy: Option<PathBuf>,
}

/// Everything the sources say.
#[derive(Debug)]
pub struct Loaded {
    pub policies: Vec<Policy>,
    pub envoy: EnvoyConfig,
    /// The policies file's `[audit]` table.
    pub audit: Option<AuditConfig>,
}

/// A config that cannot be used: the message names the file, the line and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error(transparent)]
    Policies(#[from] ConfigError),
    #[error(transparent)]
    Envoy(#[from] EnvoyConfigError),
}

impl Sources {
    /// Reads and validates every source.
    pub fn load(&self) -> Result<Loaded, LoadError> {
        let (policies, audit) = match &self.policies {
            Some(path) => {
                let config = config::load(path)?;
                (config.policies, config.audit)
            }
            None => (Vec::new(), None),
        };
        let envoy = match &self.envoy {
            Some(dir) => envoy_config::load_dir(dir)?,
            None => EnvoyConfig::default(),
        };
        Ok(Loaded {
            policies,
            envoy,
            audit,
        })
    }

    fn watched(&self) -> Vec<PathBuf> {
        self.policies
            .iter()
            .chain(self.envoy.iter())
            .cloned()
            .collect()
    }
}

/// Loads and installs the config (policies, Envoy trees, and `[audit]`: a changed table
/// starts the new sinks before the policies change, so a sink that cannot start rejects
/// the reload); on error logs it and keeps the old one. Whether it was installed.
pub fn reload(service: &Service, sources: &Sources) -> bool {
    let outcome = sources
        .load()
        .map_err(|e| e.to_string())
        .and_then(|loaded| {
            let audit = service
                .prepare_audit(loaded.audit.as_ref())
                .map_err(|e| e.to_string())?;
            let audit_changed = audit.is_some();
            service
                .replace(loaded.policies, loaded.envoy)
                .map_err(|e| e.to_string())?;
            service.install_audit(audit);
            if audit_changed {
                tracing::info!(audit = ?loaded.audit, "audit sinks replaced");
            }
            Ok(())
        });
    service.metrics().reloaded(outcome.is_ok());
    match outcome {
        Ok(()) => {
            tracing::info!(
                policies = service.limiter().policy_count(),
                "config reloaded"
            );
            true
        }
        Err(error) => {
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

/// Starts reloading on SIGHUP (when `on_hangup`) and when anything under the sources
/// changes (when `on_change`). The SIGHUP handler is installed before this returns, so a SIGHUP sent once the
/// service announces itself reloads rather than kills it. Must be called within a Tokio
/// runtime.
pub(crate) fn spawn(
    service: Arc<Service>,
    sources: Sources,
    on_hangup: bool,
    on_change: bool,
) -> tokio::task::JoinHandle<()> {
    #[cfg(unix)]
    let hangup = on_hangup
        .then(|| tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok())
        .flatten();
    #[cfg(not(unix))]
    let hangup = {
        let _ = on_hangup;
        None::<()>
    };
    tokio::spawn(watch(service, sources, hangup, on_change))
}

#[cfg(unix)]
type Hangup = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangup = ();

async fn watch(
    service: Arc<Service>,
    sources: Sources,
    #[cfg_attr(not(unix), allow(unused_mut, unused_variables))] mut hangup: Option<Hangup>,
    on_change: bool,
) {
    let watched = if on_change {
        sources.watched()
    } else {
        Vec::new()
    };
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
                reload(&service, &sources);
            }
            _ = tick.tick() => {
                let now = fingerprint(&watched);
                if now != last {
                    last = now;
                    tracing::info!("config changed on disk: reloading");
                    reload(&service, &sources);
                }
            }
        }
    }
}
