//! `ds4-bench`: prefill and decode throughput, in the shape of llama-bench.

use std::time::Instant;

use clap::Parser;
use ds4_inference_worker::cli::{init_logging, ModelArgs};
use ds4_inference_worker::runtime::LoadedModel;
use ds4_kernels::CpuBackend;
use ds4_model::Logits;
use serde::Serialize;

/// Measure prefill (ppN: N prompt tokens in one batch) and decode (tgN: N
/// tokens one at a time after a short prompt) speed, as median tok/s over
/// repetitions, printed as a markdown table (or JSON lines with --json).
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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    init_logging("warn");
    let cli = Cli::parse();
    cli.model.init_threads();
    let lm = LoadedModel::open(&cli.model.model, CpuBackend::new(), None)?;
    let vocab = lm.model.info().n_vocab as u32;
    // Deterministic, ordinary tokens (skip the low control ids).
    let tokens = |n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| 1000 + (i * 7919) % (vocab - 1000))
            .collect()
    };
    let be = &lm.backend;
    let reps = cli.repetitions.max(1);
    let mut rows = Vec::new();

    for &n in cli.n_prompt.iter().filter(|&&n| n > 0) {
        let prompt = tokens(n);
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let mut seq = lm.model.new_sequence(be, n + 1);
            let t = Instant::now();
            lm.model.forward(be, &mut seq, &prompt, Logits::Last)?;
            if rep > 0 {
                samples.push(n as f64 / t.elapsed().as_secs_f64()); // rep 0 warms up
            }
        }
        rows.push(Row {
            model: lm.model_id.clone(),
            backend: "cpu",
            threads: rayon::current_num_threads(),
            test: format!("pp{n}"),
            tokens_per_s: median(&mut samples.clone()),
            samples,
        });
    }
    for &n in cli.n_gen.iter().filter(|&&n| n > 0) {
        let mut samples = Vec::new();
        for rep in 0..=reps {
            let mut seq = lm.model.new_sequence(be, n + 2);
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
            backend: "cpu",
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
