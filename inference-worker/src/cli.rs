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
}

impl ModelArgs {
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
