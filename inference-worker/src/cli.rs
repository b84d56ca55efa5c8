//! Pieces shared by the binaries: common flags, logging, thread pool, the
//! one-line form of a start-up error.

use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args};
use ds4_kernels::cuda::CudaOptions;
use ds4_kernels::Numerics;

/// Flags every binary that loads a model takes.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model file (GGUF; for a split model, the first shard).
    #[arg(
        short = 'm',
        long = "model",
        env = "DS4_MODEL",
        default_value = "./ds4.gguf"
    )]
    pub model: PathBuf,
    /// CPU threads for compute (default: one per core).
    #[arg(short = 't', long, env = "DS4_THREADS")]
    pub threads: Option<usize>,
    /// Where to compute: `auto` (the first CUDA GPU when one is usable,
    /// else the CPU, with a log line saying why), `cpu`, `cuda` or `cuda:N`.
    #[arg(long, env = "DS4_DEVICE", default_value = "auto")]
    pub device: String,
    /// Exact numerics: weights dequantized to f32, f32 activations and
    /// caches, no activation rounding. For comparisons with float
    /// reference implementations and between devices; slower.
    #[arg(long, env = "DS4_EXACT_NUMERICS")]
    pub exact_numerics: bool,
    #[command(flatten)]
    pub cuda: CudaArgs,
}

const CUDA_HEADING: &str = "CUDA tuning (for measurements and debugging; results are the same)";

/// The CUDA backend's switches (`--device cuda`). Each also reads its
/// `DS4_CUDA_*` environment variable; none changes results beyond the
/// order in which a few kernels add their terms.
#[derive(Args, Debug, Clone)]
pub struct CudaArgs {
    /// Replay repeated forward passes as CUDA graphs.
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_GRAPHS", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_graphs: bool,
    /// Programmatic dependent launches (sm_90+).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_PDL", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_pdl: bool,
    /// With early launches, zero fresh tensors with a kernel rather than
    /// memsets (which stop the next kernel's early launch).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_ZERO_KERNEL", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_zero_kernel: bool,
    /// Run a one-token pass's dense decoder layers as one cluster launch
    /// each (sm_90+).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_FUSED_LAYER", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_fused_layer: bool,
    /// One-token Q8_0 matvecs stage their weight rows in shared memory
    /// (16-byte loads) and add a row's blocks in the batched kernels'
    /// order, so a token's result does not depend on its batch (sm_80+).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_STAGED_Q8", value_name = "on|off", default_value = "off",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_staged_q8: bool,
    /// Expert and grouped matvecs of a few tokens run one warp per output
    /// row (off: the block-per-rows kernels; same results).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_WARP_MV", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_warp_mv: bool,
    /// One-token grouped Q8_0 projections (DeepSeek V4's output low-rank)
    /// run the dense decode matvec (off: the expert matvecs, which add in
    /// a batch's order).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_GROUPED_MV", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_grouped_mv: bool,
    /// The hyper-connection post takes in the residual add before it and
    /// hands the next pre step its sums of squares (off: separate launches).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_HC_FUSE", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_hc_fuse: bool,
    /// The hyper-connection Sinkhorn split runs on a second stream beside
    /// the sublayer that needs it only at its end (off: in line).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_HC_BRANCH", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_hc_branch: bool,
    /// The side branches of a forward pass (DeepSeek V4: the shared
    /// expert beside the routed ones, the KV row and compressors beside
    /// the query path) run on a second stream (off: in line).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_BRANCHES", value_name = "on|off", default_value = "on",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_branches: bool,
    /// Quantized batches of at most N tokens use the dp4a kernel instead
    /// of the tensor cores.
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_DP4A_TOKENS", value_name = "N",
          default_value_t = CudaOptions::DEFAULT.dp4a_tokens)]
    pub cuda_dp4a_tokens: usize,
    /// Batches of at most N tokens through large Q4_K matrices use the
    /// multi-token matvec (0: never).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_MVT_TOKENS", value_name = "N",
          default_value_t = CudaOptions::DEFAULT.mvt_tokens)]
    pub cuda_mvt_tokens: usize,
    /// Issue a pass in chunks of about N commands, each its own graph (0:
    /// the whole pass at once).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_CHUNK", value_name = "N",
          default_value_t = CudaOptions::DEFAULT.chunk_cmds)]
    pub cuda_chunk: usize,
    /// Time every kernel; print the table at exit (slow).
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_PROFILE", value_name = "on|off", default_value = "off",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_profile: bool,
    /// Print where the host's time went at exit.
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_TIMING", value_name = "on|off", default_value = "off",
          value_parser = BoolishValueParser::new(), action = ArgAction::Set,
          hide_possible_values = true)]
    pub cuda_timing: bool,
    /// Read kernel sources from DIR where it has them (`common.cuh`,
    /// `moe.cu`, ...; the others built in), compiled at start: for
    /// working on a kernel without rebuilding. Changed sources may change
    /// results.
    #[arg(long, help_heading = CUDA_HEADING, env = "DS4_CUDA_KERNEL_DIR", value_name = "DIR")]
    pub cuda_kernel_dir: Option<PathBuf>,
}

impl CudaArgs {
    /// The backend's options from these flags.
    pub fn options(&self, numerics: Numerics) -> CudaOptions {
        CudaOptions {
            numerics,
            graphs: self.cuda_graphs,
            pdl: self.cuda_pdl,
            zero_kernel: self.cuda_zero_kernel,
            fused_layer: self.cuda_fused_layer,
            staged_q8: self.cuda_staged_q8,
            warp_mv: self.cuda_warp_mv,
            grouped_mv: self.cuda_grouped_mv,
            hc_fuse: self.cuda_hc_fuse,
            hc_branch: self.cuda_hc_branch,
            branches: self.cuda_branches,
            dp4a_tokens: self.cuda_dp4a_tokens,
            mvt_tokens: self.cuda_mvt_tokens,
            chunk_cmds: self.cuda_chunk,
            profile: self.cuda_profile,
            timing: self.cuda_timing,
            kernel_dir: self
                .cuda_kernel_dir
                .clone()
                .map(ds4_kernels::cuda::leak_path),
        }
    }
}

/// The compute backend chosen by `--device`.
pub enum Device {
    Cpu(ds4_kernels::CpuBackend),
    Cuda(Box<ds4_kernels::cuda::CudaBackend>),
}

impl Device {
    pub fn name(&self) -> &'static str {
        match self {
            Device::Cpu(_) => "cpu",
            Device::Cuda(_) => "cuda",
        }
    }
}

impl ModelArgs {
    /// The numerics `--exact-numerics` asks for.
    pub fn numerics(&self) -> Numerics {
        if self.exact_numerics {
            Numerics::Exact
        } else {
            Numerics::Production
        }
    }

    /// Open the backend `--device` asks for, in the numerics asked for.
    pub fn open_device(&self) -> anyhow::Result<Device> {
        self.open_device_with(self.numerics())
    }

    /// Open the backend `--device` asks for, computing with `numerics`.
    pub fn open_device_with(&self, numerics: Numerics) -> anyhow::Result<Device> {
        use ds4_kernels::cuda::CudaBackend;
        use ds4_kernels::CpuBackend;
        let cuda = |ordinal: usize| {
            CudaBackend::with_options(ordinal, self.cuda.options(numerics)).map(|be| {
                let s = be.compile_stats();
                tracing::info!(
                    ordinal,
                    arch = be.arch(),
                    kernels_compiled = s.compiled,
                    kernels_cached = s.cached,
                    "computing on CUDA"
                );
                Device::Cuda(Box::new(be))
            })
        };
        match self.device.as_str() {
            "cpu" => Ok(Device::Cpu(CpuBackend::with_numerics(numerics))),
            "auto" => Ok(cuda(0).unwrap_or_else(|e| {
                tracing::info!(reason = %e, "no usable CUDA device; computing on the CPU");
                Device::Cpu(CpuBackend::with_numerics(numerics))
            })),
            "cuda" => Ok(cuda(0)?),
            other => {
                let ordinal = other
                    .strip_prefix("cuda:")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| {
                        anyhow::anyhow!("--device {other:?}: expected auto, cpu, cuda or cuda:N")
                    })?;
                Ok(cuda(ordinal)?)
            }
        }
    }

    /// Size the compute thread pool; call once, before any compute.
    pub fn init_threads(&self) {
        if let Some(n) = self.threads.filter(|&n| n > 0) {
            // Fails only if the pool was already built; then the default stands.
            let _ = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build_global();
        }
    }
}

/// An error and its causes on one line, each cause only if the messages
/// before it do not already say it (typed errors include their source in
/// their own message; context added with anyhow does not).
pub fn error_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line.replace('\n', "; ")
}

/// Log to stderr; `RUST_LOG` (e.g. `ds4=debug`) overrides `default`.
pub fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
