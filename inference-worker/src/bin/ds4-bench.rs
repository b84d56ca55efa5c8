//! `ds4-bench`: prefill and decode throughput in the shape of llama-bench
//! (one sequence, straight model calls), and serving benchmarks through
//! the engine (context frontiers, concurrency sweep, prefix reuse).

use std::time::Instant;

use clap::Parser;
use ds4_inference_worker::cli::{init_logging, Device, ModelArgs};
use ds4_inference_worker::grammar::{Grammars, Spec};
use ds4_inference_worker::metrics::Metrics;
use ds4_inference_worker::runtime::LoadedModel;
use ds4_inference_worker::{bench, engine};
use ds4_kernels::Backend;
use ds4_model::Logits;
use serde::Serialize;

/// Measure prefill (ppN: N prompt tokens in one batch) and decode (tgN: N
/// tokens one at a time after a short prompt) speed, as median tok/s over
/// repetitions, printed as a markdown table (or JSON lines with --json).
///
/// With --frontiers, --concurrency or --prefix-reuse it measures the
/// serving engine instead (continuous batching, paged KV cache, prefix
/// cache), loading the model once:
///
///   ds4-bench --prompt-file README.md --frontiers 512,1024,2048 --concurrency 1,2,4,8,16 --prefix-reuse 1000
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to measure (0 to skip prefill).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Tokens to generate for the decode test (0 to skip).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Context depths for the decode test: tgN at depth D decodes N tokens
    /// after a D-token prompt (prefilled once per depth, reported as
    /// `ctxD` with its prefill tok/s; the repetitions continue on that
    /// sequence). 0: after a one-token prompt.
    #[arg(
        short = 'd',
        long = "n-depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    n_depth: Vec<usize>,
    /// Prefill in chunks of at most this many tokens, one forward pass
    /// each (0: the whole prompt in one pass).
    #[arg(long, default_value_t = 2048)]
    chunk: usize,
    /// After the tests, time every kernel of a few decode steps (at the
    /// first depth) and of one prefill chunk of --chunk tokens, and print
    /// each table with the time per step (CUDA; kernels run serialized,
    /// so the tables rank kernels rather than measure speed).
    #[arg(long)]
    profile: bool,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 3)]
    repetitions: usize,
    /// Print one JSON object per test instead of a table.
    #[arg(long)]
    json: bool,
    /// Text whose tokens make the engine benchmarks' prompts (repeated as
    /// needed); default: fixed pseudo-random ordinary tokens.
    #[arg(long)]
    prompt_file: Option<std::path::PathBuf>,
    /// Engine: one cold request per context size (prefill tok/s, TTFT,
    /// decode tok/s at that context).
    #[arg(long, value_delimiter = ',')]
    frontiers: Vec<usize>,
    /// Engine: that many concurrent streams per run (aggregate and
    /// per-stream decode tok/s).
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Engine: prompt tokens of each concurrent stream.
    #[arg(long, default_value_t = 64)]
    stream_prompt: usize,
    /// Engine: run the whole --concurrency list this many times,
    /// interleaved, and report each stream count's median (with the
    /// slowest and fastest sweep): on a noisy machine a single sweep's
    /// ratio follows the machine's mood of the moment.
    #[arg(long, default_value_t = 1)]
    sweeps: usize,
    /// Engine: a second request sharing a prefix of this many tokens with a
    /// finished one (cached tokens, TTFT against the cold request).
    #[arg(long)]
    prefix_reuse: Option<usize>,
    /// Engine: tokens generated per request.
    #[arg(long, default_value_t = 64)]
    gen: usize,
    /// Engine, with --concurrency: also run each stream count with half of
    /// its streams held to this JSON schema (constrained decoding), and
    /// compare the aggregate with the unconstrained run. Give a schema
    /// that cannot end within --gen tokens, e.g. `{"type": "array",
    /// "items": {"type": "integer"}, "minItems": 1000}`.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<std::path::PathBuf>,
}

impl Cli {
    fn engine_mode(&self) -> bool {
        !self.frontiers.is_empty() || !self.concurrency.is_empty() || self.prefix_reuse.is_some()
    }
}

#[derive(Serialize)]
struct Row {
    model: String,
    backend: &'static str,
    threads: usize,
    test: String,
    tokens_per_s: f64,
    samples: Vec<f64>,
}

/// Deterministic ordinary tokens (the low ids are control tokens; a
/// miniature vocabulary keeps its upper half).
fn filler(n: usize, vocab: u32) -> Vec<u32> {
    let base = 1000.min(vocab / 2);
    (0..n as u32)
        .map(|i| base + (i * 7919) % (vocab - base))
        .collect()
}

fn engine_bench<B: Backend + 'static>(cli: &Cli, lm: LoadedModel<B>) -> anyhow::Result<()>
where
    B::KvPool: 'static,
    B::Weight: 'static,
{
    let vocab = lm.model.info().n_vocab as u32;
    let text = match &cli.prompt_file {
        Some(p) => {
            let s =
                std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            lm.chat.tokenizer.encode(&s, false)?
        }
        None => filler(4096, vocab),
    };
    anyhow::ensure!(!text.is_empty(), "the prompt file has no tokens");
    let longest = cli
        .frontiers
        .iter()
        .copied()
        .chain(cli.prefix_reuse.map(|n| n + 4))
        .chain([cli.stream_prompt + 1])
        .max()
        .unwrap_or(0);
    let max_streams = cli.concurrency.iter().copied().max().unwrap_or(1).max(1);
    let cfg = engine::EngineConfig {
        ctx: longest + cli.gen + 1,
        max_seqs: max_streams,
        ..engine::EngineConfig::default()
    };
    let model_id = lm.model_id.clone();
    let threads = rayon::current_num_threads();
    let backend = lm.backend.name();
    let grammar = match &cli.json_schema {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", p.display()))?;
            let grammars = Grammars::new(lm.chat.tokenizer.clone())?;
            Some(grammars.compile(&Spec::JsonSchema(schema), None, None)?)
        }
        None => None,
    };
    let engine = engine::spawn(lm, cfg, std::sync::Arc::new(Metrics::new()))?;
    let h = &engine.handle;
    // Distinct leading tokens keep the runs from sharing cached prefixes.
    let mut marker = 2000u32;
    // Warm up (page in the weights, spin up the threads).
    bench::frontiers(h, &text, &[64], 8, &mut marker)?;
    if !cli.json {
        println!(
            "model {model_id}, {backend} backend, {threads} threads, {} generated tokens per request",
            cli.gen
        );
    }
    if !cli.frontiers.is_empty() {
        let rows = bench::frontiers(h, &text, &cli.frontiers, cli.gen, &mut marker)?;
        if cli.json {
            rows.iter().try_for_each(|r| print_json("frontier", r))?;
        } else {
            println!("\n| context | prefill tok/s | TTFT ms | decode tok/s |");
            println!("| ---: | ---: | ---: | ---: |");
            for r in &rows {
                println!(
                    "| {} | {:.1} | {:.1} | {:.1} |",
                    r.context, r.prefill_tps, r.ttft_ms, r.decode_tps
                );
            }
        }
    }
    if !cli.concurrency.is_empty() {
        let rows = bench::concurrency(
            h,
            &text,
            &cli.concurrency,
            cli.stream_prompt,
            cli.gen,
            cli.sweeps,
            grammar.as_ref(),
            &mut marker,
        )?;
        if cli.json {
            rows.iter().try_for_each(|r| print_json("concurrency", r))?;
        } else {
            if cli.sweeps > 1 {
                println!(
                    "\n{} interleaved sweeps; medians, aggregate range in brackets",
                    cli.sweeps
                );
            }
            println!(
                "\n| streams | constrained | aggregate decode tok/s | per-stream decode tok/s | vs 1 stream |"
            );
            println!("| ---: | ---: | ---: | ---: | ---: |");
            for r in &rows {
                let x = r.speedup.map_or("-".into(), |x| format!("{x:.2}x"));
                let range = if r.sweeps > 1 {
                    format!(" [{:.1}-{:.1}]", r.aggregate_min, r.aggregate_max)
                } else {
                    String::new()
                };
                println!(
                    "| {} | {} | {:.1}{range} | {:.1} | {x} |",
                    r.streams, r.constrained, r.aggregate_tps, r.per_stream_tps
                );
            }
            if grammar.is_some() {
                println!("\n| streams | aggregate, half constrained / none |");
                println!("| ---: | ---: |");
                for free in rows.iter().filter(|r| r.constrained == 0) {
                    let held = rows
                        .iter()
                        .find(|r| r.constrained > 0 && r.streams == free.streams);
                    if let Some(held) = held.filter(|_| free.aggregate_tps > 0.0) {
                        println!(
                            "| {} | {:.3} |",
                            free.streams,
                            held.aggregate_tps / free.aggregate_tps
                        );
                    }
                }
            }
        }
    }
    if let Some(n) = cli.prefix_reuse {
        let rows = bench::prefix_reuse(h, &text, n, cli.gen.min(8), &mut marker)?;
        if cli.json {
            rows.iter().try_for_each(|r| print_json("prefix", r))?;
        } else {
            println!("\n| request | prompt tokens | cached tokens | TTFT ms |");
            println!("| --- | ---: | ---: | ---: |");
            for r in &rows {
                println!(
                    "| {} | {} | {} | {:.1} |",
                    r.request, r.prompt_tokens, r.cached_tokens, r.ttft_ms
                );
            }
            if let [cold, warm] = &rows[..] {
                println!(
                    "\nTTFT ratio (cold / shared prefix): {:.1}x",
                    cold.ttft_ms / warm.ttft_ms
                );
            }
        }
    }
    engine.shutdown();
    Ok(())
}

fn print_json(kind: &str, row: &impl Serialize) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(row)?;
    v["bench"] = kind.into();
    println!("{v}");
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The --profile tables: decode steps after a context of the first
/// depth, then one prefill chunk (each warmed up once first).
fn profile<B: Backend + 'static>(
    cli: &Cli,
    lm: &LoadedModel<B>,
    chunk: &[u32],
    prefill: impl Fn(&mut ds4_model::Sequence<B>, &[u32]) -> anyhow::Result<()>,
    decode: impl Fn(&mut ds4_model::Sequence<B>, usize) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    const STEPS: usize = 8;
    let be = &lm.backend;
    let depth = cli.n_depth.first().copied().unwrap_or(0).max(1);
    let context: Vec<u32> = filler(depth, lm.model.info().n_vocab as u32);
    let mut seq = lm.model.new_sequence(be, depth + 2 * STEPS + 1)?;
    prefill(&mut seq, &context)?;
    decode(&mut seq, STEPS)?;
    be.profile(true)?;
    decode(&mut seq, STEPS)?;
    let Some(table) = be.profile(false)? else {
        eprintln!(
            "--profile: the {} backend has no kernel profiler",
            be.name()
        );
        return Ok(());
    };
    println!("\nkernels of {STEPS} decode steps at depth {depth} (divide by {STEPS} for one step):\n{table}");
    for rep in 0..2 {
        let mut seq = lm.model.new_sequence(be, chunk.len() + 1)?;
        if rep == 1 {
            be.profile(true)?;
        }
        lm.model.forward(be, &mut seq, chunk, Logits::Last)?;
    }
    if let Some(table) = be.profile(false)? {
        println!(
            "\nkernels of one prefill chunk of {} tokens:\n{table}",
            chunk.len()
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    init_logging("warn");
    let cli = Cli::parse();
    cli.model.init_threads();
    match cli.model.open_device()? {
        Device::Cpu(be) => bench(&cli, be),
        Device::Cuda(be) => bench(&cli, *be),
    }
}

fn bench<B: Backend + 'static>(cli: &Cli, backend: B) -> anyhow::Result<()>
where
    B::KvPool: 'static,
    B::Weight: 'static,
{
    let lm = LoadedModel::open(&cli.model.model, backend, None)?;
    if cli.engine_mode() {
        return engine_bench(cli, lm);
    }
    let vocab = lm.model.info().n_vocab as u32;
    let tokens = |n: usize| filler(n, vocab);
    let be = &lm.backend;
    let reps = cli.repetitions.max(1);
    let mut rows = Vec::new();
    let row = |test: String, samples: Vec<f64>| Row {
        model: lm.model_id.clone(),
        backend: lm.backend.name(),
        threads: rayon::current_num_threads(),
        test,
        tokens_per_s: median(&mut samples.clone()),
        samples,
    };
    // With --json each row is printed as soon as it is measured, so that
    // a run cut short keeps what it measured.
    let emit = |rows: &mut Vec<Row>, r: Row| -> anyhow::Result<()> {
        if cli.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        rows.push(r);
        Ok(())
    };
    // A prompt in chunks of --chunk tokens; logits of the last only.
    let prefill = |seq: &mut ds4_model::Sequence<B>, prompt: &[u32]| -> anyhow::Result<()> {
        let step = if cli.chunk == 0 {
            prompt.len().max(1)
        } else {
            cli.chunk
        };
        for part in prompt.chunks(step) {
            lm.model.forward(be, seq, part, Logits::Last)?;
        }
        Ok(())
    };
    let decode = |seq: &mut ds4_model::Sequence<B>, n: usize| -> anyhow::Result<()> {
        for tok in tokens(n) {
            lm.model.forward(be, seq, &[tok], Logits::Last)?;
        }
        Ok(())
    };

    for &n in cli.n_prompt.iter().filter(|&&n| n > 0) {
        let prompt = tokens(n);
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let mut seq = lm.model.new_sequence(be, n + 1)?;
            let t = Instant::now();
            prefill(&mut seq, &prompt)?;
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64()); // rep 0 warms up
            }
        }
        emit(&mut rows, row(format!("pp{n}"), samples))?;
    }
    let gens: Vec<usize> = cli.n_gen.iter().copied().filter(|&n| n > 0).collect();
    for &depth in &cli.n_depth {
        if gens.is_empty() {
            break;
        }
        let context = tokens(depth.max(1));
        let room = context.len() + (reps + 1) * gens.iter().sum::<usize>() + 1;
        let mut seq = lm.model.new_sequence(be, room)?;
        let t = Instant::now();
        prefill(&mut seq, &context)?;
        if depth > 0 {
            let tps = depth as f64 / t.elapsed().as_secs_f64();
            emit(&mut rows, row(format!("ctx{depth}"), vec![tps]))?;
        }
        let at = |n: usize| match depth {
            0 => format!("tg{n}"),
            d => format!("tg{n}@d{d}"),
        };
        for &n in &gens {
            let mut samples = Vec::new();
            for rep in 0..=reps {
                let t = Instant::now();
                decode(&mut seq, n)?;
                if rep > 0 {
                    samples.push(n as f64 / t.elapsed().as_secs_f64());
                }
            }
            emit(&mut rows, row(at(n), samples))?;
        }
    }
    if cli.profile {
        profile(cli, &lm, &tokens(cli.chunk.max(1)), prefill, decode)?;
    }
    if !cli.json {
        println!("| model | backend | threads | test | tok/s |");
        println!("| --- | --- | ---: | ---: | ---: |");
        for r in &rows {
            println!(
                "| {} | {} | {} | {} | {:.1} |",
                r.model, r.backend, r.threads, r.test, r.tokens_per_s
            );
        }
    }
    Ok(())
}
