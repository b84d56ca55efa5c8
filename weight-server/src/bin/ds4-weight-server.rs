//! `ds4-weight-server`: the long-lived weight owner. Parses flags and
//! calls [`Owner::start`]; `status` and `drain` ask a running owner.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use ds4_proto::auth::{BearerAuth, Token};
use ds4_proto::client::{connect, ControlAddr, ControlClient};
use ds4_proto::control as pb;
use ds4_proto::layout::rank::Rank;
use ds4_proto::manifest::{Manifest, SCOPE_BASE};
use ds4_weight_server::load::BackendChoice;
use ds4_weight_server::owner::Owner;
use ds4_weight_server::start::{Config, Outcome, StartError};

/// Hold a model's weights in GPU (CUDA VMM) or shared host memory and hand
/// them to restartable ds4-server workers.
///
///   Start:      ds4-weight-server --base MODEL.gguf --manifest /run/ds4/weights.json
///   Preflight:  add --dry-run (allocates nothing; exit 0 fits, 1 does not, 2 unsupported)
///               add --check-tensors to also scan the weights for NaN/Inf
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
    /// HOST:PORT, which must be loopback unless --grpc-allow-remote.
    #[arg(long, env = "DS4_WEIGHT_GRPC")]
    grpc: Option<String>,
    /// Accept a non-loopback --grpc address. Needs --grpc-token-file:
    /// whoever reaches the control plane can drain and stop the owner.
    #[arg(long, env = "DS4_WEIGHT_GRPC_ALLOW_REMOTE")]
    grpc_allow_remote: bool,
    /// File holding a shared secret (at least 16 printable characters, not
    /// readable by every user) that every call to a TCP --grpc must carry;
    /// status, drain and workers read the same file. Make one with
    /// `(umask 077; head -c 32 /dev/urandom | base64 > FILE)`.
    #[arg(long, env = "DS4_WEIGHT_GRPC_TOKEN_FILE")]
    grpc_token_file: Option<PathBuf>,
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
    /// Before placing anything, scan every tensor for NaN or infinite
    /// values and block scales (reads all the weights; a bad one is
    /// refused, naming the tensor and its first bad block).
    #[arg(long, env = "DS4_WEIGHT_CHECK_TENSORS")]
    check_tensors: bool,
    /// Device measurements: instead of a model, fill this many GiB of
    /// regions (at most 2 GiB each) with a known pattern; workers check
    /// the import with `ds4-server --weights-check`.
    #[arg(long, env = "DS4_WEIGHT_SYNTHETIC_GB", conflicts_with = "base")]
    synthetic_gb: Option<f64>,
    /// Hold one rank of a model split over several GPUs, expert-parallel:
    /// INDEX/COUNT (e.g. 0/2) places routed experts [INDEX*E/COUNT,
    /// (INDEX+1)*E/COUNT) of every routed expert tensor and every other
    /// tensor whole, and says so in the manifest. One owner per GPU, each
    /// with its own --device and --manifest; --dry-run gives each rank's
    /// verdict. Workers serve a whole model only today: this plans and
    /// holds the ranks of a model too large for one GPU.
    #[arg(long, env = "DS4_WEIGHT_RANK", value_name = "INDEX/COUNT", value_parser = Rank::parse, conflicts_with = "synthetic_gb")]
    rank: Option<Rank>,
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
    /// The owner's token file, for a TCP control plane that needs one.
    #[arg(long, env = "DS4_WEIGHT_GRPC_TOKEN_FILE")]
    grpc_token_file: Option<PathBuf>,
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
    /// The owner's token file, for a TCP control plane that needs one.
    #[arg(long, env = "DS4_WEIGHT_GRPC_TOKEN_FILE")]
    grpc_token_file: Option<PathBuf>,
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
                tracing::error!("{}", error_line(&e));
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
            eprintln!("error: {}", error_line(&e));
            1
        }
    }
}

/// An error and its causes on one line, each cause only if the messages
/// before it do not already say it (typed errors include their source in
/// their own message; context added with anyhow does not).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !line.contains(&c) {
            line.push_str(": ");
            line.push_str(&c);
        }
    }
    line.replace('\n', "; ")
}

async fn control_of(
    manifest_path: &Path,
    token_file: Option<&Path>,
) -> anyhow::Result<ControlClient> {
    let m = Manifest::read(manifest_path)?;
    let addr = ControlAddr::parse(&m.control.grpc);
    let token = token_file.map(Token::read_file).transpose()?;
    connect(&addr, BearerAuth::new(token.as_ref()))
        .await
        .with_context(|| {
            format!(
                "cannot reach the weight owner at {addr} (pid {}); is it running?",
                m.owner.pid
            )
        })
}

async fn status(cli: &StatusCli) -> anyhow::Result<()> {
    let mut c = control_of(&cli.manifest, cli.grpc_token_file.as_deref()).await?;
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
    let mut c = control_of(&cli.manifest, cli.grpc_token_file.as_deref()).await?;
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

impl From<Cli> for Config {
    fn from(cli: Cli) -> Config {
        Config {
            base: cli.base,
            manifest: cli.manifest,
            backend: cli.backend,
            scope: cli.scope,
            reserve_gb: cli.reserve_gb,
            device: cli.device,
            grpc: cli.grpc,
            grpc_allow_remote: cli.grpc_allow_remote,
            grpc_token_file: cli.grpc_token_file,
            broker: cli.broker,
            allow_gids: cli.allow_gids,
            lease_timeout_s: cli.lease_timeout_s,
            dry_run: cli.dry_run,
            check_tensors: cli.check_tensors,
            synthetic_gb: cli.synthetic_gb,
            rank: cli.rank.unwrap_or(Rank::WHOLE),
        }
    }
}

/// Run the owner; the preflight report goes to stdout (`--dry-run`) or,
/// when the weights do not fit, to stderr before the error.
fn run(cli: Cli) -> anyhow::Result<i32> {
    match Owner::start(cli.into()) {
        Ok(outcome) => {
            if let Outcome::Preflight { report, .. } = &outcome {
                print!("{report}");
            }
            Ok(outcome.exit_code())
        }
        Err(e) => {
            if let StartError::DoesNotFit { report, .. } = &e {
                eprint!("{report}");
            }
            Err(e.into())
        }
    }
}
