//! Serving loaded weights: bind the control plane and the fd broker,
//! publish the manifest, tell systemd, run the reaper, the watchdog and
//! the signal handler until shutdown, then remove the manifest (if still
//! ours) and the sockets. Called by [`Owner::start`] once every region is
//! uploaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ds4_proto::auth::Token;
use ds4_proto::client::ControlAddr;
use ds4_proto::manifest::{self, BackendEntry, Control, Manifest, Owner as OwnerEntry, SCOPE_BASE};

use crate::broker;
use crate::grpc;
use crate::load::Loaded;
use crate::notify::Notifier;
use crate::owner::{EventKind, Identity, Owner};
use crate::peer::PeerPolicy;
use crate::start::{Config, StartError};

/// `<dir>/<stem>.<suffix>` beside the manifest.
fn beside(manifest: &Path, suffix: &str) -> PathBuf {
    let stem = manifest
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("weights");
    manifest.with_file_name(format!("{stem}.{suffix}"))
}

/// The control-plane address: `--grpc`, else a socket beside the manifest.
pub(crate) fn control_addr(config: &Config) -> ControlAddr {
    match &config.grpc {
        Some(a) => ControlAddr::parse(a),
        None => ControlAddr::Unix(beside(&config.manifest, "control.sock")),
    }
}

/// Serve `loaded` until shutdown, published as `owner_entry`; the regions
/// are released when this returns. With `token`, every TCP control-plane
/// call must carry it.
pub(crate) fn serve(
    config: &Config,
    notifier: &Notifier,
    loaded: Loaded,
    owner_entry: OwnerEntry,
    backend_name: &str,
    token: Option<Token>,
) -> Result<(), StartError> {
    let broker_path = config
        .broker
        .clone()
        .unwrap_or_else(|| beside(&config.manifest, "broker.sock"));
    let generation = owner_entry.generation;
    let identity = Identity {
        layout_identity: loaded.model.layout_identity.clone(),
        content_identity: loaded.model.content_identity.clone(),
        backend: backend_name.into(),
        bytes_resident: loaded.store.bytes_resident(),
        generation,
        regions: loaded.scope.regions.clone(),
    };
    let owner = Arc::new(Owner::new(
        identity,
        Duration::from_secs_f64(config.lease_timeout_s.max(0.5)),
    ));
    let policy = PeerPolicy::current(config.allow_gids.clone());
    let fds = loaded
        .store
        .fds()
        .into_iter()
        .map(|f| f.try_clone_to_owned())
        .collect::<Result<Vec<_>, _>>()?;
    let ids = loaded.scope.regions.iter().map(|r| r.id).collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let control_addr = control_addr(config);
    let listener = {
        let _g = rt.enter();
        grpc::bind(&control_addr).map_err(|source| StartError::Listen {
            addr: control_addr.to_string(),
            source,
        })?
    };
    broker::start(
        &broker_path,
        owner.clone(),
        broker::Regions { ids, fds },
        policy.clone(),
    )
    .map_err(|source| StartError::Listen {
        addr: broker_path.display().to_string(),
        source,
    })?;
    tracing::info!("broker listening path={}", broker_path.display());

    let mut scopes = BTreeMap::new();
    scopes.insert(SCOPE_BASE.to_string(), loaded.scope.clone());
    let manifest = Manifest {
        schema: manifest::SCHEMA.into(),
        owner: owner_entry,
        model: loaded.model.clone(),
        backend: BackendEntry {
            kind: loaded.store.kind(),
            device: loaded.store.device(),
        },
        control: Control {
            grpc: control_addr.to_string(),
            broker: std::fs::canonicalize(&broker_path).unwrap_or(broker_path.clone()),
        },
        scopes,
        rank: (!config.rank.is_whole()).then_some(config.rank),
    };

    let result = rt.block_on(async {
        let mut shutdown = owner.shutdown_signal();
        let server = {
            let mut rx = owner.shutdown_signal();
            tokio::spawn(grpc::serve(
                owner.clone(),
                listener,
                policy,
                token,
                async move {
                    let _ = rx.wait_for(|s| *s).await;
                },
            ))
        };
        manifest.publish(&config.manifest)?;
        owner.emit(EventKind::Ready, "ready");
        let ready = format!(
            "ready: {} regions, {:.2} GiB {backend_name}, generation {generation}",
            manifest.scopes[SCOPE_BASE].regions.len(),
            owner.identity().bytes_resident as f64 / (1u64 << 30) as f64
        );
        notifier.ready(&ready);
        tracing::info!(grpc = %control_addr, "ready manifest={}", config.manifest.display());

        let reaper = spawn_reaper(owner.clone());
        let watchdog = notifier.watchdog_interval().map(spawn_watchdog);
        spawn_signal_handler(owner.clone());
        let _ = shutdown.wait_for(|s| *s).await;
        notifier.stopping();
        reaper.abort();
        if let Some(w) = watchdog {
            w.abort();
        }
        // Give event watchers a moment to see "shutting down".
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        Ok::<(), StartError>(())
    });
    // Remove the manifest if it is still ours, and the sockets.
    if let Ok(m) = Manifest::read(&config.manifest) {
        if m.owner.pid == std::process::id() {
            let _ = std::fs::remove_file(&config.manifest);
        }
    }
    let _ = std::fs::remove_file(&broker_path);
    if let ControlAddr::Unix(p) = &control_addr {
        let _ = std::fs::remove_file(p);
    }
    drop(loaded);
    result
}

/// Reap leases without a keep-alive, four times per lease timeout.
fn spawn_reaper(owner: Arc<Owner>) -> tokio::task::JoinHandle<()> {
    let every = owner.lease_timeout() / 4;
    tokio::spawn(async move {
        let mut t = tokio::time::interval(every);
        loop {
            t.tick().await;
            owner.reap();
        }
    })
}

/// Ping the systemd watchdog every `every`.
fn spawn_watchdog(every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let n = Notifier::from_env();
        let mut t = tokio::time::interval(every);
        loop {
            t.tick().await;
            n.watchdog();
        }
    })
}

/// Shut down on SIGINT or SIGTERM.
fn spawn_signal_handler(owner: Arc<Owner>) {
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        owner.request_shutdown("signal received");
    });
}
