//! `ds4`: run a prompt through a model, or chat with it interactively.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use ds4_inference_worker::cli::{init_logging, ModelArgs};
use ds4_inference_worker::generate::{generate, GenerateRequest, Generation};
use ds4_inference_worker::runtime::LoadedModel;
use ds4_inference_worker::sampler::SamplingParams;
use ds4_kernels::cpu::sampling::top_k;
use ds4_kernels::CpuBackend;
use ds4_model::prompt::ChatMessage;
use ds4_model::Logits;
use serde::Serialize;

/// Generate text with a GGUF model on the CPU.
///
/// With -p or --prompt-file, the prompt is rendered with the model's chat
/// template (unless --raw), the answer is printed, and timings go to stderr.
/// Without a prompt, ds4 starts an interactive chat on the terminal.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Cli {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt (a user message, or raw text with --raw).
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(long, conflicts_with = "prompt")]
    prompt_file: Option<PathBuf>,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 1.0)]
    temperature: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Context size in tokens (prompt plus completion).
    #[arg(long, default_value_t = 4096)]
    ctx: usize,
    /// Use the prompt as raw text, without the chat template.
    #[arg(long)]
    raw: bool,
    /// System message for chat prompts (default: the template's own).
    #[arg(long)]
    system: Option<String>,
    /// Write the prompt's token ids and the top 20 logits at the position
    /// after the prompt as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    dump_logits: Option<PathBuf>,
}

#[derive(Serialize)]
struct LogitDump {
    prompt_token_ids: Vec<u32>,
    top: Vec<TopLogit>,
}

#[derive(Serialize)]
struct TopLogit {
    id: u32,
    logit: f32,
}

fn main() -> anyhow::Result<()> {
    init_logging("warn");
    let cli = Cli::parse();
    cli.model.init_threads();
    let lm = LoadedModel::open(&cli.model.model, CpuBackend::new(), None)?;
    let sampling = SamplingParams {
        temperature: cli.temperature,
        top_k: cli.top_k,
        top_p: cli.top_p,
        min_p: cli.min_p,
        seed: cli.seed,
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    let prompt = match (&cli.prompt, &cli.prompt_file) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(f)) => {
            Some(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
        }
        (None, None) => None,
    };
    match prompt {
        Some(p) => one_shot(&cli, &lm, &p, sampling),
        None => chat(&cli, &lm, sampling),
    }
}

fn system_messages(cli: &Cli) -> Vec<ChatMessage> {
    cli.system
        .iter()
        .map(|s| ChatMessage {
            role: "system".into(),
            content: s.clone(),
        })
        .collect()
}

fn one_shot(
    cli: &Cli,
    lm: &LoadedModel<CpuBackend>,
    text: &str,
    sampling: SamplingParams,
) -> anyhow::Result<()> {
    let ids = if cli.raw {
        lm.prompter.raw_prompt(text)?
    } else {
        let mut messages = system_messages(cli);
        messages.push(ChatMessage {
            role: "user".into(),
            content: text.to_string(),
        });
        lm.prompter.chat_prompt(&messages)?.1
    };
    let mut seq = lm.model.new_sequence(&lm.backend, cli.ctx);
    if let Some(path) = &cli.dump_logits {
        let logits = lm
            .model
            .forward(&lm.backend, &mut seq, &ids, Logits::Last)?;
        let top = top_k(&logits, 20)
            .into_iter()
            .map(|(id, logit)| TopLogit { id, logit })
            .collect();
        let dump = LogitDump {
            prompt_token_ids: ids.clone(),
            top,
        };
        std::fs::write(path, serde_json::to_vec_pretty(&dump)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let req = GenerateRequest {
        prompt: ids,
        max_tokens: cli.n_predict,
        sampling,
        stop: Vec::new(),
    };
    let g = run(lm, &mut seq, &req)?;
    println!();
    report(&g);
    Ok(())
}

fn run(
    lm: &LoadedModel<CpuBackend>,
    seq: &mut ds4_model::Sequence<CpuBackend>,
    req: &GenerateRequest,
) -> anyhow::Result<Generation> {
    let mut out = std::io::stdout();
    let mut on_text = |t: &str| {
        let _ = out.write_all(t.as_bytes());
        let _ = out.flush();
        ControlFlow::Continue(())
    };
    Ok(generate(lm, seq, req, &mut on_text)?)
}

fn report(g: &Generation) {
    let t = &g.timings;
    eprintln!(
        "[prompt {} tokens ({} cached), {:.1} tok/s | generated {} tokens, {:.1} tok/s | {:?}]",
        t.prompt_tokens,
        t.cached_tokens,
        t.prefill_tps(),
        t.generated_tokens,
        t.decode_tps(),
        g.finish
    );
}

fn chat(cli: &Cli, lm: &LoadedModel<CpuBackend>, sampling: SamplingParams) -> anyhow::Result<()> {
    if cli.raw || lm.prompter.template.is_none() {
        anyhow::bail!("interactive chat needs the model's chat template; pass -p for a raw prompt");
    }
    eprintln!("ds4 chat with {} (Ctrl-D or /exit to quit)", lm.model_id);
    let mut messages = system_messages(cli);
    let mut seq = lm.model.new_sequence(&lm.backend, cli.ctx);
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        if line.trim() == "/exit" {
            break;
        }
        messages.push(ChatMessage {
            role: "user".into(),
            content: line.to_string(),
        });
        let (_, ids) = lm.prompter.chat_prompt(&messages)?;
        let max_tokens = cli.n_predict.min(cli.ctx.saturating_sub(ids.len()));
        let req = GenerateRequest {
            prompt: ids,
            max_tokens,
            sampling: sampling.clone(),
            stop: Vec::new(),
        };
        match run(lm, &mut seq, &req) {
            Ok(g) => {
                println!();
                report(&g);
                messages.push(ChatMessage {
                    role: "assistant".into(),
                    content: g.text,
                });
            }
            Err(e) => {
                eprintln!("error: {e}");
                messages.pop();
            }
        }
    }
    Ok(())
}
