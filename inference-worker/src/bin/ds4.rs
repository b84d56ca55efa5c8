//! `ds4`: run a prompt through a model, or chat with it interactively.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ds4_inference_worker::cli::{init_logging, Device, ModelArgs};
use ds4_inference_worker::generate::{generate, GenerateRequest, Generation};
use ds4_inference_worker::runtime::LoadedModel;
use ds4_inference_worker::sampler::SamplingParams;
use ds4_kernels::cpu::sampling::top_k;
use ds4_kernels::Backend;
use ds4_model::chat::{
    AnswerEvent, AnswerFormat, AnswerParser, ChatError, Conversation, RenderOptions, ReplayStore,
    Role, Thinking,
};
use ds4_model::gguf::GgufFile;
use ds4_model::{Logits, Model};
use serde::Serialize;

/// Generate text with a GGUF model, on the CPU or a CUDA GPU (--device).
///
/// With -p or --prompt-file, the prompt is rendered with the model's chat
/// protocol (its chat template, or DeepSeek V4's own prompt format) unless
/// --raw; the answer goes to stdout, the model's reasoning (families that
/// think) and timings to stderr. Without a prompt, ds4 starts an
/// interactive chat on the terminal.
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
    /// How hard a model that thinks (DeepSeek V4) thinks: none, minimal,
    /// low, medium, high, xhigh or max (max needs --ctx of 393216 or more;
    /// below it, high). Models that do not think ignore it.
    #[arg(long, default_value = "high", value_parser = parse_effort)]
    reasoning_effort: Thinking,
    /// Write the prompt's token ids and the top 20 logits at the position
    /// after the prompt as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    dump_logits: Option<PathBuf>,
    /// Evaluate the token ids in FILE (comma- or whitespace-separated) as
    /// one prefill, or one token at a time with --decode, and write every
    /// position's logits to --logits-json (no chat template, no sampling).
    #[arg(
        long,
        value_name = "FILE",
        env = "DS4_TOKENS_FILE",
        requires = "logits_json"
    )]
    tokens_file: Option<PathBuf>,
    /// Where --tokens-file writes its logits: {"tokens": [...],
    /// "positions": [{"pos", "token", "argmax", "logits": [...]}]}.
    #[arg(
        long,
        value_name = "OUT",
        env = "DS4_LOGITS_JSON",
        requires = "tokens_file"
    )]
    logits_json: Option<PathBuf>,
    /// With --tokens-file: feed the tokens one by one (decode steps).
    #[arg(long, requires = "tokens_file")]
    decode: bool,
}

#[derive(Serialize)]
struct PositionLogits {
    pos: usize,
    token: u32,
    argmax: usize,
    logits: Vec<f32>,
}

#[derive(Serialize)]
struct LogitsJson {
    tokens: Vec<u32>,
    positions: Vec<PositionLogits>,
}

fn parse_effort(s: &str) -> Result<Thinking, String> {
    Thinking::from_effort(s).ok_or_else(|| format!("expected one of {}", Thinking::EFFORTS))
}

/// `--tokens-file`: logits for every position of a fixed token sequence.
fn eval_tokens<B: Backend>(
    cli: &Cli,
    backend: B,
    tokens_file: &Path,
    out: &Path,
) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(tokens_file)
        .with_context(|| format!("reading {}", tokens_file.display()))?;
    let tokens = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("{}: {t:?} is not a token id", tokens_file.display()))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    anyhow::ensure!(
        !tokens.is_empty(),
        "{} holds no token ids",
        tokens_file.display()
    );
    let file = GgufFile::open(&cli.model.model)
        .with_context(|| format!("opening {}", cli.model.model.display()))?;
    let model = Model::load(&file, &backend)?;
    let n_vocab = model.info().n_vocab;
    let mut seq = model.new_sequence(&backend, tokens.len().max(cli.ctx))?;
    let logits = if cli.decode {
        let mut all = Vec::with_capacity(tokens.len() * n_vocab);
        for &t in &tokens {
            all.extend(model.forward(&backend, &mut seq, &[t], Logits::Last)?);
        }
        all
    } else {
        model.forward(&backend, &mut seq, &tokens, Logits::All)?
    };
    let positions = logits
        .chunks_exact(n_vocab)
        .zip(&tokens)
        .enumerate()
        .map(|(pos, (row, &token))| PositionLogits {
            pos,
            token,
            argmax: row
                .iter()
                .enumerate()
                .fold(
                    (0, f32::NEG_INFINITY),
                    |b, (i, &v)| if v > b.1 { (i, v) } else { b },
                )
                .0,
            logits: row.to_vec(),
        })
        .collect();
    let json = LogitsJson { tokens, positions };
    std::fs::write(out, serde_json::to_vec(&json)?)
        .with_context(|| format!("writing {}", out.display()))?;
    eprintln!("wrote {}", out.display());
    Ok(())
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
    match cli.model.open_device()? {
        Device::Cpu(be) => run_with(&cli, be),
        Device::Cuda(be) => run_with(&cli, *be),
    }
}

/// Everything after the backend is chosen.
fn run_with<B: Backend>(cli: &Cli, backend: B) -> anyhow::Result<()> {
    if let (Some(tokens_file), Some(out)) = (&cli.tokens_file, &cli.logits_json) {
        return eval_tokens(cli, backend, tokens_file, out);
    }
    let lm = LoadedModel::open(&cli.model.model, backend, None)?;
    let sampling = SamplingParams {
        temperature: cli.temperature,
        top_k: cli.top_k,
        top_p: cli.top_p,
        min_p: cli.min_p,
        seed: cli.seed,
        ..SamplingParams::default()
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
        Some(p) => one_shot(cli, &lm, &p, sampling),
        None => chat(cli, &lm, sampling),
    }
}

/// A conversation holding the `--system` message, if any.
fn new_conversation(cli: &Cli) -> Conversation {
    let mut c = Conversation {
        thinking: Some(cli.reasoning_effort),
        ..Conversation::default()
    };
    if let Some(s) = &cli.system {
        c.push_text(Role::System, s);
    }
    c
}

fn render_options(cli: &Cli) -> RenderOptions {
    RenderOptions {
        ctx: cli.ctx,
        replay: Arc::new(ReplayStore::default()),
        // The effort asked on the command line is honoured as written.
        levers: ds4_model::chat::Levers {
            effort_native: true,
            ..Default::default()
        },
    }
}

fn one_shot<B: Backend>(
    cli: &Cli,
    lm: &LoadedModel<B>,
    text: &str,
    sampling: SamplingParams,
) -> anyhow::Result<()> {
    let (ids, answer) = if cli.raw {
        (lm.chat.raw_prompt(text)?, AnswerFormat::default())
    } else {
        let mut c = new_conversation(cli);
        c.push_text(Role::User, text);
        let r = lm.chat.render(&c, &render_options(cli))?;
        (r.tokens, r.answer)
    };
    let mut seq = lm.model.new_sequence(&lm.backend, cli.ctx)?;
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
        ignore_eos: false,
        constraint: None,
    };
    let (g, _) = run(lm, &mut seq, &req, answer)?;
    println!();
    report(&g);
    Ok(())
}

/// Generate, printing the answer to stdout and reasoning to stderr (dim on
/// a terminal) as they come; returns the generation and its answer split
/// into (reasoning, answer text).
fn run<B: Backend>(
    lm: &LoadedModel<B>,
    seq: &mut ds4_model::Sequence<B>,
    req: &GenerateRequest,
    answer: AnswerFormat,
) -> anyhow::Result<(Generation, (String, String))> {
    let mut parser = AnswerParser::new(answer, "call_");
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let dim = err.is_terminal();
    let (mut reasoning, mut text) = (String::new(), String::new());
    let mut show = |events: Vec<AnswerEvent>| {
        for e in events {
            match e {
                AnswerEvent::Reasoning(r) => {
                    let _ = if dim {
                        write!(err, "\x1b[2m{r}\x1b[0m")
                    } else {
                        write!(err, "{r}")
                    };
                    reasoning.push_str(&r);
                }
                AnswerEvent::Text(t) => {
                    let _ = out.write_all(t.as_bytes());
                    let _ = out.flush();
                    text.push_str(&t);
                }
                // No tools are offered here.
                AnswerEvent::CallStart { .. } | AnswerEvent::CallArgs { .. } => {}
                AnswerEvent::CallEnd => {}
            }
        }
    };
    let g = generate(lm, seq, req, &mut |t: &str| {
        show(parser.push(t));
        ControlFlow::Continue(())
    })?;
    show(parser.finish().0);
    Ok((g, (reasoning, text)))
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

fn chat<B: Backend>(
    cli: &Cli,
    lm: &LoadedModel<B>,
    sampling: SamplingParams,
) -> anyhow::Result<()> {
    if cli.raw {
        anyhow::bail!("interactive chat renders a conversation; --raw needs -p");
    }
    let mut convo = new_conversation(cli);
    let opts = render_options(cli);
    if !lm.chat.can_chat() {
        anyhow::bail!("{}", ChatError::NoTemplate);
    }
    eprintln!("ds4 chat with {} (Ctrl-D or /exit to quit)", lm.model_id);
    let mut seq = lm.model.new_sequence(&lm.backend, cli.ctx)?;
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
        let mut next = convo.clone();
        next.push_text(Role::User, line);
        let rendered = match lm.chat.render(&next, &opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                continue;
            }
        };
        let max_tokens = cli
            .n_predict
            .min(cli.ctx.saturating_sub(rendered.tokens.len()));
        let req = GenerateRequest {
            prompt: rendered.tokens,
            max_tokens,
            sampling: sampling.clone(),
            stop: Vec::new(),
            ignore_eos: false,
            constraint: None,
        };
        match run(lm, &mut seq, &req, rendered.answer) {
            Ok((g, (reasoning, text))) => {
                println!();
                report(&g);
                next.push_reasoning(&reasoning);
                next.push_text(Role::Assistant, &text);
                convo = next;
            }
            Err(e) => eprintln!("error: {e}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_model() -> Option<PathBuf> {
        let dir = std::env::var_os("DS4_TINY_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ds4-tiny")
            });
        let p = dir.join("ds4-tiny.gguf");
        p.exists().then_some(p)
    }

    /// `--tokens-file` / `--logits-json` on the miniature DeepSeek V4 model
    /// in exact numerics, prefill and decode, against llama.cpp's logits.
    #[test]
    fn tokens_file_writes_the_reference_json_shape() {
        let model = tiny_model().expect(
            "run ./scripts/gen-ds4-tiny.sh (or ./scripts/test.sh) first, or set DS4_TINY_DIR",
        );
        let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../model/tests/fixtures/deepseek4/logits-f32-64.trim.json");
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let tokens: Vec<u64> = reference["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let tokens_file = dir.path().join("tokens.txt");
        // Mixed separators, as the flag documents.
        let text: Vec<String> = tokens.iter().map(u64::to_string).collect();
        std::fs::write(
            &tokens_file,
            format!("{}\n{}", text[..10].join(","), text[10..].join(" ")),
        )
        .unwrap();
        for decode in [false, true] {
            let out = dir.path().join(format!("out-{decode}.json"));
            let mut args = vec![
                "ds4".to_string(),
                "-m".into(),
                model.display().to_string(),
                "--exact-numerics".into(),
                "--tokens-file".into(),
                tokens_file.display().to_string(),
                "--logits-json".into(),
                out.display().to_string(),
            ];
            if decode {
                args.push("--decode".into());
            }
            let cli = Cli::try_parse_from(args).unwrap();
            eval_tokens(
                &cli,
                ds4_kernels::CpuBackend::with_numerics(ds4_kernels::Numerics::Exact),
                &tokens_file,
                &out,
            )
            .unwrap();
            let ours: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
            assert_eq!(ours["tokens"], reference["tokens"]);
            let pos = ours["positions"].as_array().unwrap();
            assert_eq!(pos.len(), tokens.len());
            for (i, (p, r)) in pos
                .iter()
                .zip(reference["positions"].as_array().unwrap())
                .enumerate()
            {
                assert_eq!(p["pos"], i);
                assert_eq!(p["token"], tokens[i]);
                assert_eq!(p["argmax"], r["argmax"]);
                assert_eq!(p["logits"].as_array().unwrap().len(), 512);
                if let Some(full) = r["logits"].as_array() {
                    for (a, b) in p["logits"].as_array().unwrap().iter().zip(full) {
                        assert!((a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4);
                    }
                }
            }
        }
    }
}
