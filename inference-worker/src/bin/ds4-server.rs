//! `ds4-server`: serve a model over the OpenAI-compatible HTTP API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ds4_inference_worker::api::{
    listen, AppState, ConnectionLimits, ServerOptions, SlipOptions, TraceFile,
};
use ds4_inference_worker::cli::{error_line, init_logging, Device, ModelArgs};
use ds4_inference_worker::engine;
use ds4_inference_worker::metrics::Metrics;
use ds4_inference_worker::weights::{explicit_model, WeightsArgs};
use ds4_kernels::Backend;
use ds4_model::chat::{Levers, Thinking};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Replay {
    Keep,
    Drop,
}

fn parse_effort(s: &str) -> Result<Thinking, String> {
    match s {
        "off" => Ok(Thinking::Off),
        "low" | "high" => Ok(Thinking::High),
        "max" => Ok(Thinking::Max),
        _ => Err("expected off, low, high or max".into()),
    }
}

/// Serve a GGUF model over HTTP: POST /v1/chat/completions, /v1/completions,
/// /v1/responses, /v1/messages; GET /v1/models, /health, /metrics, /v1/stats.
///
/// Example: ds4-server -m ./ds4.gguf --port 8000, then
/// curl http://127.0.0.1:8000/v1/chat/completions -H 'content-type: application/json'
///   -d '{"messages":[{"role":"user","content":"Hi"}]}'
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, env = "DS4_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, env = "DS4_PORT", default_value_t = 8000)]
    port: u16,
    /// Tokens per request (prompt plus completion); default: the model's
    /// training context, at most 8192.
    #[arg(long, env = "DS4_CTX")]
    ctx: Option<usize>,
    /// Model id reported by /v1/models (default: derived from the file name).
    #[arg(long, env = "DS4_MODEL_ID")]
    model_id: Option<String>,
    /// Require this key on every endpoint but /health, sent as
    /// `Authorization: Bearer KEY` or `x-api-key: KEY`.
    #[arg(long, env = "DS4_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Send CORS headers (any origin) and answer preflight requests.
    #[arg(long, env = "DS4_CORS")]
    cors: bool,
    /// Largest request body accepted, in MiB. A larger declared
    /// Content-Length gets 413 before the body is read.
    #[arg(long, env = "DS4_MAX_BODY_MB", default_value_t = 32)]
    max_body_mb: usize,
    /// Accept any Content-Type on the JSON endpoints. By default they take
    /// only application/json (or a +json type) and answer 415 otherwise,
    /// so that a web page cannot post to the server without a CORS
    /// preflight.
    #[arg(long, env = "DS4_ALLOW_ANY_CONTENT_TYPE")]
    allow_any_content_type: bool,
    /// Tool-call reminder: past about 96 KB of conversation, each tool
    /// result ends with a short, byte-stable reminder of the family's
    /// call syntax (so deep agent loops keep calling tools). Earlier
    /// results render the same as the conversation grows: prefix reuse
    /// stays warm. Shallow conversations are never touched.
    #[arg(long, env = "DS4_TOOL_CALL_REMINDER", value_enum, default_value = "on")]
    tool_call_reminder: OnOff,
    /// Whether earlier assistant reasoning sent back in history is
    /// rendered again (keep: the reference format; drop: shorter prompts,
    /// but the history's bytes change once a turn is no longer the last,
    /// which costs prefix reuse there). The turn being continued always
    /// keeps its reasoning.
    #[arg(long, env = "DS4_REASONING_REPLAY", value_enum, default_value = "keep")]
    reasoning_replay: Replay,
    /// The thinking mode of requests that name no effort: off, low, high
    /// or max, honoured as written (default: the family's, high).
    #[arg(long, env = "DS4_REASONING_EFFORT", value_parser = parse_effort)]
    reasoning_effort: Option<Thinking>,
    /// Let a client's `max` effort select DeepSeek V4's native Think Max
    /// tier (its preamble degraded deep-context tool calling in the
    /// reference engine's measurements); by default a client's high,
    /// xhigh and max all mean the prefix-free thinking level.
    #[arg(long, env = "DS4_REASONING_EFFORT_NATIVE")]
    reasoning_effort_native: bool,
    /// Draw a tools-armed JSON answer that ended with stop and no tool call
    /// once more before the client sees it (the prompt is unchanged, so the
    /// second draw reuses its cached prefix; counted in
    /// ds4_tool_slip_resamples_total). Streams are never redrawn.
    #[arg(long, env = "DS4_TOOL_SLIP_RESAMPLE")]
    tool_slip_resample: bool,
    /// Write every tools-armed JSON answer that ended without a tool call to
    /// one JSON file in DIR (request body, generated text and reasoning,
    /// verdict). The files hold the clients' requests: mind who can read DIR.
    #[arg(long, env = "DS4_TOOL_SLIP_DUMP", value_name = "DIR")]
    tool_slip_dump: Option<std::path::PathBuf>,
    /// Append every request's story to FILE, one JSON object per line:
    /// the prompt as the model reads it, the prefix cache's decision
    /// (cached tokens, and why reuse ends where it does), tool calls as
    /// the parser finds them, and the answer. Prompts are written whole
    /// and hold the clients' data: for debugging, and mind who can read
    /// FILE.
    #[arg(long, env = "DS4_TRACE", value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// Most tokens one answer may generate: a request that asks for more,
    /// or names no limit, gets this many and ends with finish reason
    /// `length`. Default: what the context leaves after the prompt (agent
    /// clients ask for up to 32,000; a small model may ramble that far).
    #[arg(long, env = "DS4_MAX_TOKENS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: Option<u32>,
    /// Seconds a client has to send a complete request head: from the
    /// connect for the first request, from its first byte for the next
    /// ones on a kept-alive connection. Then the connection is closed.
    #[arg(long, env = "DS4_HEADER_TIMEOUT_S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_s: u64,
    /// Seconds a declared request body has to arrive after its head; then
    /// the request gets 408 and the connection is closed.
    #[arg(long, env = "DS4_BODY_TIMEOUT_S", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_s: u64,
    /// Seconds a kept-alive connection may wait for its next request before
    /// it is closed. A request in flight (a long prefill, a stream) is
    /// never cut.
    #[arg(long, env = "DS4_IDLE_TIMEOUT_S", default_value_t = 75, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_s: u64,
    /// Open connections served at once. At the cap, the longest-open
    /// connection that is only waiting on its client (idle, or slow to send
    /// its request) is closed to make room; when all are answering
    /// requests, a few more connections get /health or a 503 with
    /// Retry-After, and the rest are closed at once. Default: half the
    /// open-file limit (ulimit -n), 16 to 4096.
    #[arg(long, env = "DS4_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// Sequences generated at once (continuous batching); more requests wait.
    #[arg(long, env = "DS4_MAX_SEQS", default_value_t = 16)]
    max_seqs: usize,
    /// Tokens per engine step: one per running sequence plus prompt chunks.
    #[arg(long, env = "DS4_BATCH_TOKENS", default_value_t = 512)]
    batch_tokens: usize,
    /// Largest piece of one prompt run per step (a multiple of 16).
    #[arg(long, env = "DS4_PREFILL_CHUNK", default_value_t = 512)]
    prefill_chunk: usize,
    /// Memory for the KV cache, activation scratch and buffers, in GiB
    /// (fractions allowed). Default: half of the memory available at start
    /// (GPU memory with --device cuda), at most what --max-seqs full
    /// contexts need. Requests that do not fit get HTTP 503 with
    /// Retry-After.
    #[arg(long, env = "DS4_KV_MEMORY_GB")]
    kv_memory_gb: Option<f64>,
    /// Directory of the disk KV cache: long prompt prefixes are saved there
    /// (after long prefills, on eviction and at shutdown) and restored
    /// instead of recomputed, also after a restart.
    #[arg(long, env = "DS4_KV_DISK_DIR")]
    kv_disk_dir: Option<std::path::PathBuf>,
    /// Size limit of the disk KV cache in MiB (oldest files are evicted).
    #[arg(long, env = "DS4_KV_DISK_SPACE_MB", default_value_t = 4096)]
    kv_disk_space_mb: u64,
    #[command(flatten)]
    weights: WeightsArgs,
}

fn main() {
    init_logging("info");
    if let Err(e) = run() {
        // One line: what is wrong with what, and what to do.
        eprintln!("error: {}", error_line(e.as_ref()));
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
    let explicit_model = explicit_model(&matches, "model");
    if cli.weights.weights_check {
        println!("{}", cli.weights.check(explicit_model)?);
        return Ok(());
    }
    cli.model.init_threads();
    match cli.model.open_device()? {
        Device::Cpu(be) => serve(cli, explicit_model, be),
        Device::Cuda(be) => serve(cli, explicit_model, *be),
    }
}

fn serve<B: Backend + 'static>(
    cli: Cli,
    explicit_model: Option<std::path::PathBuf>,
    backend: B,
) -> anyhow::Result<()>
where
    B::KvPool: 'static,
    B::Weight: 'static,
{
    let addr: SocketAddr = format!("{}:{}", cli.host, cli.port)
        .parse()
        .with_context(|| format!("invalid listen address {}:{}", cli.host, cli.port))?;
    let trace = match &cli.trace {
        Some(p) => Some(Arc::new(TraceFile::open(p).with_context(|| {
            format!("cannot open the trace file {}", p.display())
        })?)),
        None => None,
    };
    let (lm, weights) = cli.weights.load(
        &cli.model.model,
        explicit_model,
        backend,
        cli.model_id.clone(),
    )?;
    let info = lm.model.info().clone();
    let ctx = cli.ctx.unwrap_or(info.n_ctx_train.min(8192)).max(16);
    tracing::info!(
        model = %lm.path.display(),
        model_id = %lm.model_id,
        family = info.family.name(),
        layers = info.n_layer,
        vocab = info.n_vocab,
        ctx,
        backend = lm.backend.name(),
        threads = rayon::current_num_threads(),
        load_s = format!("{:.2}", lm.load_seconds),
        "model loaded"
    );
    let chat = lm.chat.clone();
    let model_id = lm.model_id.clone();
    let cfg = engine::EngineConfig {
        ctx,
        max_seqs: cli.max_seqs,
        batch_tokens: cli.batch_tokens,
        prefill_chunk: cli.prefill_chunk,
        memory_bytes: cli.kv_memory_gb.map(|g| (g * (1u64 << 30) as f64) as u64),
        disk: cli
            .kv_disk_dir
            .clone()
            .map(|d| (d, cli.kv_disk_space_mb << 20)),
        ..engine::EngineConfig::default()
    };
    let engine = engine::spawn(lm, cfg, Arc::new(Metrics::new()))?;
    let handle = engine.handle.clone();
    let opts = ServerOptions {
        api_key: cli.api_key.clone().filter(|k| !k.is_empty()),
        cors: cli.cors,
        max_body_bytes: cli.max_body_mb.max(1) * 1024 * 1024,
        allow_any_content_type: cli.allow_any_content_type,
        limits: ConnectionLimits {
            header_timeout: Duration::from_secs(cli.header_timeout_s),
            body_timeout: Duration::from_secs(cli.body_timeout_s),
            idle_timeout: Duration::from_secs(cli.idle_timeout_s),
            max_connections: cli
                .max_connections
                .map_or_else(listen::default_max_connections, |n| {
                    usize::try_from(n).unwrap_or(usize::MAX)
                }),
        },
        owner_alive: weights.as_ref().map(|w| w.owner_alive_flag()),
        levers: Levers {
            tool_reminder: cli.tool_call_reminder == OnOff::On,
            reasoning_replay: cli.reasoning_replay == Replay::Keep,
            effort_native: cli.reasoning_effort_native,
            default_thinking: cli.reasoning_effort,
        },
        slips: SlipOptions {
            resample: cli.tool_slip_resample,
            dump_dir: cli.tool_slip_dump.clone(),
        },
        trace,
        max_answer_tokens: cli.max_tokens.map_or(usize::MAX, |n| n as usize),
    };
    let state = Arc::new(AppState::new(handle, chat, model_id, ctx, opts));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let l = &state.limits;
        tracing::info!(
            %addr,
            max_connections = l.max_connections,
            header_timeout_s = l.header_timeout.as_secs(),
            body_timeout_s = l.body_timeout.as_secs(),
            idle_timeout_s = l.idle_timeout.as_secs(),
            "listening; try: curl http://{addr}/v1/models"
        );
        listen::run(listener, state, shutdown_signal()).await;
        anyhow::Ok(())
    })?;
    // Requests are done: let the engine checkpoint and stop.
    drop(rt);
    engine.shutdown();
    tracing::info!("shut down");
    drop(weights);
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("signal received, finishing in-flight requests");
}
