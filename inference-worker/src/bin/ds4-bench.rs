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

/// Deterministic ordinary tokens (the low ids are control tokens).
fn filler(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 1000 + (i * 7919) % (vocab - 1000))
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

    for &n in cli.n_prompt.iter().filter(|&&n| n > 0) {
        let prompt = tokens(n);
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let mut seq = lm.model.new_sequence(be, n + 1)?;
            let t = Instant::now();
            lm.model.forward(be, &mut seq, &prompt, Logits::Last)?;
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64()); // rep 0 warms up
            }
        }
        rows.push(Row {
            model: lm.model_id.clone(),
            backend: lm.backend.name(),
            threads: rayon::current_num_threads(),
            test: format!("pp{n}"),
            tokens_per_s: median(&mut samples.clone()),
            samples,
        });
    }
    for &n in cli.n_gen.iter().filter(|&&n| n > 0) {
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let mut seq = lm.model.new_sequence(be, n + 2)?;
            lm.model.forward(be, &mut seq, &tokens(1), Logits::Last)?;
            let t = Instant::now();
            for tok in tokens(n) {
                lm.model.forward(be, &mut seq, &[tok], Logits::Last)?;
            }
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64());
            }
        }
        rows.push(Row {
            model: lm.model_id.clone(),
            backend: lm.backend.name(),
            threads: rayon::current_num_threads(),
            test: format!("tg{n}"),
            tokens_per_s: median(&mut samples.clone()),
            samples,
        });
    }

    if cli.json {
        for r in &rows {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
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
