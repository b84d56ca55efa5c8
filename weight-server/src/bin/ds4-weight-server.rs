//! `ds4-weight-server`: the long-lived weight owner.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use clap::Parser;
use ds4_proto::client::{connect, ControlAddr};
use ds4_proto::control as pb;
use ds4_proto::manifest::{
    self, pid_alive, BackendEntry, Control, Manifest, Owner as OwnerEntry, SCOPE_BASE,
};
use ds4_weight_server::broker;
use ds4_weight_server::dryrun;
use ds4_weight_server::grpc;
use ds4_weight_server::load::{self, BackendChoice, Target};
use ds4_weight_server::notify::Notifier;
use ds4_weight_server::owner::{EventKind, Identity, Owner};
use ds4_weight_server::peer::PeerPolicy;
use ds4_weight_server::progress::Progress;

/// Hold a model's weights in GPU (CUDA VMM) or shared host memory and hand
/// them to restartable ds4-server workers.
///
///   Start:      ds4-weight-server --base MODEL.gguf --manifest /run/ds4/weights.json
///   Preflight:  add --dry-run (allocates nothing; exit 0 fits, 1 does not, 2 unsupported)
///   Status:     ds4-weight-server status --manifest PATH [--json]
///   Drain:      ds4-weight-server drain --manifest PATH [--exit-when-idle]
///   Workers:    ds4-server --weights-manifest PATH
#[derive(Parser, Debug)]
#[command(version, about, long_about, verbatim_doc_comment)]
struct Cli {
    /// Model file (GGUF; for a split model, the first shard).
    #[arg(
        long,
        env = "DS4_WEIGHT_BASE",
        required_unless_present = "synthetic_gb"
    )]
    base: Option<PathBuf>,
    /// Where to publish the manifest; the sockets go beside it by default.
    #[arg(long, env = "DS4_WEIGHT_MANIFEST")]
    manifest: PathBuf,
    /// Weight memory: vmm (CUDA VMM, default when a CUDA device is usable)
    /// or host (sealed memfds; CPU workers).
    #[arg(long, env = "DS4_WEIGHT_BACKEND", value_enum)]
    backend: Option<BackendChoice>,
    /// Scope to load (only `base` today).
    #[arg(long, env = "DS4_WEIGHT_SCOPE", default_value = SCOPE_BASE)]
    scope: String,
    /// GiB to leave free on the device (vmm) or host (host) after loading.
    #[arg(long, env = "DS4_WEIGHT_RESERVE_GB", default_value_t = 0.0)]
    reserve_gb: f64,
    /// CUDA device ordinal (vmm).
    #[arg(long, env = "DS4_WEIGHT_DEVICE", default_value_t = 0)]
    device: u32,
    /// Control plane address: unix:PATH (default: beside the manifest) or
    /// HOST:PORT (loopback TCP).
    #[arg(long, env = "DS4_WEIGHT_GRPC")]
    grpc: Option<String>,
    /// fd broker socket path (default: beside the manifest).
    #[arg(long, env = "DS4_WEIGHT_BROKER")]
    broker: Option<PathBuf>,
    /// Groups (numeric gids) whose members may attach besides the owner's user.
    #[arg(
        long = "allow-gid",
        env = "DS4_WEIGHT_ALLOW_GIDS",
        value_delimiter = ','
    )]
    allow_gids: Vec<u32>,
    /// Seconds without a keep-alive after which a lease is reaped.
    #[arg(long, env = "DS4_WEIGHT_LEASE_TIMEOUT_S", default_value_t = 10.0)]
    lease_timeout_s: f64,
    /// Validate, print the region plan and the memory against --reserve-gb,
    /// then exit (0 fits, 1 does not, 2 unsupported). Allocates nothing.
    #[arg(long, env = "DS4_WEIGHT_DRY_RUN")]
    dry_run: bool,
    /// Device measurements: instead of a model, fill this many GiB of
    /// regions (at most 2 GiB each) with a known pattern; workers check
    /// the import with `ds4-server --weights-check`.
    #[arg(long, env = "DS4_WEIGHT_SYNTHETIC_GB", conflicts_with = "base")]
    synthetic_gb: Option<f64>,
}

/// `ds4-weight-server status`: print the owner's status.
#[derive(Parser, Debug)]
#[command(name = "ds4-weight-server status")]
struct StatusCli {
    #[arg(long, env = "DS4_WEIGHT_MANIFEST")]
    manifest: PathBuf,
    /// JSON instead of a table.
    #[arg(long, env = "DS4_WEIGHT_STATUS_JSON")]
    json: bool,
}

/// `ds4-weight-server drain`: refuse new workers.
#[derive(Parser, Debug)]
#[command(name = "ds4-weight-server drain")]
struct DrainCli {
    #[arg(long, env = "DS4_WEIGHT_MANIFEST")]
    manifest: PathBuf,
    /// Exit once the last worker has detached or its lease was reaped.
    #[arg(long, env = "DS4_WEIGHT_EXIT_WHEN_IDLE")]
    exit_when_idle: bool,
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

fn main() {
    init_logging();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let code = match args.get(1).and_then(|a| a.to_str()) {
        Some("status") => client_main(|rt| {
            let cli = StatusCli::parse_from(args[1..].iter());
            rt.block_on(status(&cli))
        }),
        Some("drain") => client_main(|rt| {
            let cli = DrainCli::parse_from(args[1..].iter());
            rt.block_on(drain(&cli))
        }),
        _ => match run(Cli::parse()) {
            Ok(code) => code,
            Err(e) => {
                tracing::error!("{e:#}");
                1
            }
        },
    };
    std::process::exit(code);
}

fn client_main(f: impl FnOnce(&tokio::runtime::Runtime) -> anyhow::Result<()>) -> i32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match f(&rt) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

async fn control_of(
    manifest_path: &Path,
) -> anyhow::Result<
    ds4_proto::control::weight_owner_client::WeightOwnerClient<tonic::transport::Channel>,
> {
    let m = Manifest::read(manifest_path)?;
    let addr = ControlAddr::parse(&m.control.grpc);
    connect(&addr).await.with_context(|| {
        format!(
            "cannot reach the weight owner at {addr} (pid {}); is it running?",
            m.owner.pid
        )
    })
}

async fn status(cli: &StatusCli) -> anyhow::Result<()> {
    let mut c = control_of(&cli.manifest).await?;
    let s = c
        .get_status(pb::GetStatusRequest {})
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message()))?
        .into_inner();
    let state = match pb::OwnerState::try_from(s.state).unwrap_or(pb::OwnerState::Unspecified) {
        pb::OwnerState::Loading => "loading",
        pb::OwnerState::Ready => "ready",
        pb::OwnerState::Draining => "draining",
        pb::OwnerState::Unspecified => "unknown",
    };
    if cli.json {
        let v = serde_json::json!({
            "state": state,
            "generation": s.generation,
            "backend": s.backend,
            "bytes_resident": s.bytes_resident,
            "load_count": s.load_count,
            "leases": s.leases.iter().map(|l| serde_json::json!({
                "lease_id": l.lease_id, "worker_id": l.worker_id, "pid": l.pid,
                "scope": l.scope, "age_s": l.age_s, "last_keepalive_s": l.last_keepalive_s,
            })).collect::<Vec<_>>(),
            "uptime_s": s.uptime_s,
            "reaped_leases": s.reaped_leases,
            "pid": s.pid,
            "version": s.version,
            "layout_identity": s.layout_identity,
            "content_identity": s.content_identity,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("state            {state}");
    println!("pid              {}", s.pid);
    println!("version          {}", s.version);
    println!("generation       {}", s.generation);
    println!("backend          {}", s.backend);
    println!(
        "bytes_resident   {} ({:.3} GiB)",
        s.bytes_resident,
        s.bytes_resident as f64 / (1u64 << 30) as f64
    );
    println!("load_count       {}", s.load_count);
    println!("uptime_s         {:.1}", s.uptime_s);
    println!("reaped_leases    {}", s.reaped_leases);
    println!("layout_identity  {}", s.layout_identity);
    println!("content_identity {}", s.content_identity);
    println!("leases           {}", s.leases.len());
    if !s.leases.is_empty() {
        println!(
            "  {:<16} {:<24} {:>8} {:<6} {:>9}",
            "LEASE", "WORKER", "PID", "SCOPE", "AGE_S"
        );
        for l in &s.leases {
            println!(
                "  {:<16} {:<24} {:>8} {:<6} {:>9.1}",
                l.lease_id, l.worker_id, l.pid, l.scope, l.age_s
            );
        }
    }
    Ok(())
}

async fn drain(cli: &DrainCli) -> anyhow::Result<()> {
    let mut c = control_of(&cli.manifest).await?;
    let r = c
        .drain(pb::DrainRequest {
            exit_when_idle: cli.exit_when_idle,
        })
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message()))?
        .into_inner();
    println!(
        "draining; {} lease(s) attached{}",
        r.leases,
        if cli.exit_when_idle {
            "; the owner exits when the last one ends"
        } else {
            ""
        }
    );
    Ok(())
}

/// `<dir>/<stem>.<suffix>` beside the manifest.
fn beside(manifest: &Path, suffix: &str) -> PathBuf {
    let stem = manifest
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("weights");
    manifest.with_file_name(format!("{stem}.{suffix}"))
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let notifier = Notifier::from_env();
    if cli.scope != SCOPE_BASE {
        bail!(
            "scope {:?} is not supported; this owner loads: {SCOPE_BASE}",
            cli.scope
        );
    }
    let reserve = (cli.reserve_gb.max(0.0) * (1u64 << 30) as f64) as u64;
    notifier.status("validating model");
    let model = match &cli.base {
        Some(base) => match load::open_and_validate(base) {
            Ok(x) => Some(x),
            Err(e) => {
                tracing::error!("{e}");
                return Ok(dryrun::UNSUPPORTED);
            }
        },
        None => None,
    };
    let choice = cli.backend.unwrap_or_else(BackendChoice::detect);
    let target = Target::open(choice, cli.device)?;
    let granularity = target.granularity()?;
    let plan = match &model {
        Some((file, _)) => load::plan_for(file, granularity),
        None => load::synthetic_plan(
            (cli.synthetic_gb.unwrap_or(0.0).max(0.0) * (1u64 << 30) as f64) as u64,
            granularity,
        ),
    };
    let memory = target.memory()?;
    let backend_name = match choice {
        BackendChoice::Vmm => "vmm",
        BackendChoice::Host => "host",
    };
    let (report, fits) = match &model {
        Some((file, family)) => {
            dryrun::report(file, family.name(), backend_name, &plan, &memory, reserve)
        }
        None => dryrun::report_synthetic(backend_name, &plan, &memory, reserve),
    };
    if cli.dry_run {
        print!("{report}");
        return Ok(if fits {
            dryrun::FITS
        } else {
            dryrun::DOES_NOT_FIT
        });
    }
    if !fits {
        eprint!("{report}");
        bail!(
            "the weights do not fit with --reserve-gb {}; see --dry-run",
            cli.reserve_gb
        );
    }
    // Refuse to replace a live owner's manifest.
    let mut generation = 1;
    if let Ok(old) = Manifest::read(&cli.manifest) {
        if old.owner.pid != std::process::id() && pid_alive(old.owner.pid) {
            bail!(
                "manifest {} belongs to a running owner (pid {}); stop it first or pick another --manifest",
                cli.manifest.display(),
                old.owner.pid
            );
        }
        generation = old.owner.generation + 1;
    }
    let started_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tracing::info!(
        model = %cli.base.as_deref().unwrap_or(Path::new("(synthetic)")).display(), backend = backend_name,
        regions = plan.region_bytes.len(), bytes = plan.total_bytes(), "allocating"
    );
    let store = target.allocate(&plan)?;
    let total = model
        .as_ref()
        .map_or(plan.total_bytes(), |(f, _)| f.tensor_bytes());
    let mut progress = Progress::new(total, &notifier);
    let t0 = std::time::Instant::now();
    let loaded = match &model {
        Some((file, family)) => load::upload(file, *family, &plan, store, &mut progress)?,
        None => load::upload_synthetic(&plan, store, &mut progress)?,
    };
    let load_s = t0.elapsed().as_secs_f64();
    tracing::info!(
        bytes = loaded.store.bytes_resident(), load_s = format!("{load_s:.2}"),
        content_identity = %loaded.model.content_identity, "weights uploaded"
    );

    let grpc_addr = cli
        .grpc
        .clone()
        .unwrap_or_else(|| format!("unix:{}", beside(&cli.manifest, "control.sock").display()));
    let broker_path = cli
        .broker
        .clone()
        .unwrap_or_else(|| beside(&cli.manifest, "broker.sock"));
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
        Duration::from_secs_f64(cli.lease_timeout_s.max(0.5)),
    ));
    let policy = PeerPolicy::current(cli.allow_gids.clone());
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
    let control_addr = ControlAddr::parse(&grpc_addr);
    let listener = {
        let _g = rt.enter();
        grpc::bind(&control_addr).with_context(|| format!("cannot listen on {control_addr}"))?
    };
    broker::start(
        &broker_path,
        owner.clone(),
        broker::Regions { ids, fds },
        policy.clone(),
    )
    .with_context(|| format!("cannot listen on {}", broker_path.display()))?;
    tracing::info!("broker listening path={}", broker_path.display());

    let mut scopes = std::collections::BTreeMap::new();
    scopes.insert(SCOPE_BASE.to_string(), loaded.scope.clone());
    let manifest = Manifest {
        schema: manifest::SCHEMA.into(),
        owner: OwnerEntry {
            pid: std::process::id(),
            started_at,
            generation,
            program_version: env!("CARGO_PKG_VERSION").into(),
        },
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
    };

    let result = rt.block_on(async {
        let mut shutdown = owner.shutdown_signal();
        let server = {
            let mut rx = owner.shutdown_signal();
            tokio::spawn(grpc::serve(owner.clone(), listener, policy, async move {
                let _ = rx.wait_for(|s| *s).await;
            }))
        };
        manifest.publish(&cli.manifest)?;
        owner.emit(EventKind::Ready, "ready");
        let ready = format!(
            "ready: {} regions, {:.2} GiB {backend_name}, generation {generation}",
            manifest.scopes[SCOPE_BASE].regions.len(),
            owner.identity().bytes_resident as f64 / (1u64 << 30) as f64
        );
        notifier.ready(&ready);
        tracing::info!(grpc = %control_addr, "ready manifest={}", cli.manifest.display());

        // Reaper, watchdog and signals.
        let reaper = {
            let owner = owner.clone();
            let every = owner.lease_timeout() / 4;
            tokio::spawn(async move {
                let mut t = tokio::time::interval(every);
                loop {
                    t.tick().await;
                    owner.reap();
                }
            })
        };
        let watchdog = notifier.watchdog_interval().map(|every| {
            tokio::spawn(async move {
                let n = Notifier::from_env();
                let mut t = tokio::time::interval(every);
                loop {
                    t.tick().await;
                    n.watchdog();
                }
            })
        });
        {
            let owner = owner.clone();
            tokio::spawn(async move {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
                }
                owner.request_shutdown("signal received");
            });
        }
        let _ = shutdown.wait_for(|s| *s).await;
        notifier.stopping();
        reaper.abort();
        if let Some(w) = watchdog {
            w.abort();
        }
        // Give event watchers a moment to see "shutting down".
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        anyhow::Ok(())
    });
    // Remove the manifest if it is still ours, and the sockets.
    if let Ok(m) = Manifest::read(&cli.manifest) {
        if m.owner.pid == std::process::id() {
            let _ = std::fs::remove_file(&cli.manifest);
        }
    }
    let _ = std::fs::remove_file(&broker_path);
    if let ControlAddr::Unix(p) = &control_addr {
        let _ = std::fs::remove_file(p);
    }
    drop(loaded);
    result?;
    tracing::info!("stopped");
    Ok(0)
}
