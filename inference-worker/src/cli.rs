//! Pieces shared by the binaries: common flags, logging, thread pool.

use std::path::PathBuf;

use clap::Args;

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
    /// Open the backend `--device` asks for, in production numerics.
    pub fn open_device(&self) -> anyhow::Result<Device> {
        self.open_device_with(ds4_kernels::Numerics::Production)
    }

    /// Open the backend `--device` asks for, computing with `numerics`.
    pub fn open_device_with(&self, numerics: ds4_kernels::Numerics) -> anyhow::Result<Device> {
        use ds4_kernels::cuda::CudaBackend;
        use ds4_kernels::CpuBackend;
        let cuda = |ordinal: usize| {
            CudaBackend::new(ordinal, numerics).map(|be| {
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
