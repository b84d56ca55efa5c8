//! The engine: one thread owns the model, its KV pool and every running
//! sequence, and runs them with continuous batching (see [`scheduler`]).
//! Request handlers talk to it over a channel and get a stream of
//! [`Event`]s back (one per sampled token, then the finished
//! [`Generation`] or an error). A request is admitted against the memory
//! [`ledger`] when it is submitted, so a refusal comes before any response
//! is sent; a request whose receiver is dropped (the client went away)
//! stops at its next step.
//!
//! Files: [`blocks`] (block pool bookkeeping and the prefix index),
//! [`windows`] (window blocks of compressed-attention families),
//! [`ledger`] (memory budget and admission), [`disk`] (disk KV cache),
//! `paged` (a sequence's share of the pool: prefix reuse, allocation,
//! checkpoints), `scheduler` (the loop).

pub mod blocks;
pub mod disk;
pub mod ledger;
mod paged;
mod scheduler;
pub mod windows;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::{PoolSizes, StateLayout};
use tokio::sync::mpsc;

use crate::generate::{GenerateError, GenerateRequest, Generation, StreamOptions, TokenLogprobs};
use crate::metrics::Metrics;
use crate::runtime::LoadedModel;
use blocks::BlockManager;
use disk::{DiskCache, DiskKey};
use ledger::{Ledger, LedgerError, LedgerView, Refusal};
pub use paged::{checkpoint_len, DISK_MIN_TOKENS, DISK_TRIM_TOKENS};

/// Requests allowed to wait for a sequence slot before new ones are refused.
pub const QUEUE_DEPTH: usize = 256;

/// How the engine batches, caches and budgets.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Tokens per request (prompt plus completion).
    pub ctx: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    /// Tokens per step (decode rows plus prompt chunks).
    pub batch_tokens: usize,
    /// Largest piece of one prompt per step.
    pub prefill_chunk: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Memory budget for KV blocks, scratch and buffers, in bytes; `None`:
    /// half of the memory available now (the GPU's for a GPU backend), at
    /// most what `max_seqs` full contexts need.
    pub memory_bytes: Option<u64>,
    /// Disk KV cache directory and byte budget.
    pub disk: Option<(PathBuf, u64)>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            ctx: 4096,
            max_seqs: 16,
            batch_tokens: 512,
            prefill_chunk: 512,
            block_size: 16,
            memory_bytes: None,
            disk: None,
        }
    }
}

/// What the engine reports about one request, in order: any number of
/// `Token`s, then exactly one of `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Token {
        token: u32,
        /// Text that became final with this token (may be empty).
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    Done(Generation),
    Failed(GenerateError),
}

struct Job {
    req: GenerateRequest,
    opts: StreamOptions,
    events: mpsc::UnboundedSender<Event>,
    /// KV blocks reserved in the ledger for this request.
    reserved: usize,
    submitted: Instant,
    /// The submitter's span (the HTTP request's, with its id): the
    /// engine logs about this request inside it.
    span: tracing::Span,
}

enum Msg {
    Job(Box<Job>),
    /// Finish the admitted requests, checkpoint, stop.
    Shutdown,
}

/// Why a request did not reach the engine.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {0} requests are already waiting")]
    Busy(usize),
    #[error(transparent)]
    NoMemory(#[from] Refusal),
    #[error("the engine has stopped")]
    Stopped,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("KV pool: {0}")]
    Pool(#[from] ds4_model::ModelError),
    #[error("disk KV cache: {0}")]
    Disk(#[from] disk::DiskError),
    #[error("invalid engine settings: {0}")]
    Settings(String),
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Msg>,
    waiting: Arc<AtomicUsize>,
    ledger: Arc<Mutex<Ledger>>,
    metrics: Arc<Metrics>,
    ctx: usize,
}

impl EngineHandle {
    /// Queue a request after reserving its KV blocks; the receiver yields
    /// its events. Dropping the receiver cancels the request.
    pub fn submit(
        &self,
        req: GenerateRequest,
        opts: StreamOptions,
    ) -> Result<mpsc::UnboundedReceiver<Event>, SubmitError> {
        if self.waiting.load(Ordering::Relaxed) >= QUEUE_DEPTH {
            return Err(SubmitError::Busy(QUEUE_DEPTH));
        }
        let tokens = (req.prompt.len() + req.max_tokens).min(self.ctx);
        let reserved = {
            let mut ledger = self.ledger.lock().expect("ledger");
            let blocks = ledger.blocks_for(tokens);
            ledger.reserve(blocks)?;
            blocks
        };
        let (events, rx) = mpsc::unbounded_channel();
        let job = Job {
            req,
            opts,
            events,
            reserved,
            submitted: Instant::now(),
            span: tracing::Span::current(),
        };
        // Counted before the engine can see it: the engine's decrement
        // when it admits the job must never come first (the count would
        // wrap and every request be refused as busy meanwhile).
        self.waiting.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Msg::Job(Box::new(job))).is_err() {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            self.ledger.lock().expect("ledger").release(reserved);
            return Err(SubmitError::Stopped);
        }
        Ok(rx)
    }

    /// Requests waiting for a sequence slot.
    pub fn queue_depth(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Where the memory budget goes.
    pub fn ledger(&self) -> LedgerView {
        self.ledger.lock().expect("ledger").view()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// The engine thread, to stop cleanly.
pub struct Engine {
    pub handle: EngineHandle,
    thread: thread::JoinHandle<()>,
}

impl Engine {
    /// Finish the admitted requests, write cached prefixes to the disk
    /// cache, and wait for the thread to end.
    pub fn shutdown(self) {
        let _ = self.handle.tx.send(Msg::Shutdown);
        drop(self.handle);
        let _ = self.thread.join();
    }
}

/// Bytes of memory available to new allocations, from /proc/meminfo.
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Start the engine thread over `lm`.
pub fn spawn<B: Backend + 'static>(
    lm: LoadedModel<B>,
    cfg: EngineConfig,
    metrics: Arc<Metrics>,
) -> Result<Engine, EngineError>
where
    B::KvPool: 'static,
    B::Weight: 'static,
{
    let layout = lm.model.state_layout();
    let mut cfg = cfg;
    if let Some(bs) = layout.block_size() {
        // The family fixes its block size.
        cfg.block_size = bs;
    }
    if cfg.block_size == 0 || cfg.max_seqs == 0 || cfg.batch_tokens == 0 {
        return Err(EngineError::Settings(
            "block size, --max-seqs and --batch-tokens must be at least 1".into(),
        ));
    }
    if cfg.prefill_chunk == 0 || !cfg.prefill_chunk.is_multiple_of(cfg.block_size) {
        return Err(EngineError::Settings(format!(
            "--prefill-chunk must be a positive multiple of the KV block size ({}{})",
            cfg.block_size,
            if layout.block_size().is_some() {
                ", fixed by the model's family"
            } else {
                ""
            }
        )));
    }
    let block_bytes = layout.block_bytes(&lm.backend, cfg.block_size) as u64;
    let window_bytes = layout.window_bytes() as u64;
    // Window blocks: what every running sequence holds during a prefill
    // chunk, plus one per sequence kept as a resume point.
    let n_windows = match layout.has_windows() {
        true => cfg.max_seqs * (layout.windows_per_sequence(cfg.prefill_chunk) + 1),
        false => 0,
    };
    let n_slots = if layout.has_windows() {
        cfg.max_seqs
    } else {
        0
    };
    let sequences = n_windows as u64 * window_bytes + (n_slots * layout.slot_bytes()) as u64;
    let scratch = lm
        .model
        .scratch_bytes(cfg.batch_tokens, cfg.max_seqs, cfg.ctx) as u64;
    let disk_buffer = if cfg.disk.is_some() {
        block_bytes + window_bytes
    } else {
        0
    };
    let fixed = scratch + disk_buffer + sequences;
    let budget = cfg.memory_bytes.unwrap_or_else(|| {
        let want = fixed + (cfg.max_seqs * cfg.ctx.div_ceil(cfg.block_size)) as u64 * block_bytes;
        // KV blocks and scratch live where the backend allocates: a GPU's
        // free memory (after the weights), else the host's.
        let free = lm.backend.device_free_memory().or_else(available_memory);
        free.map_or(want, |a| want.min(a / 2))
    });
    let ledger = Ledger::new(
        budget,
        scratch,
        disk_buffer,
        sequences,
        block_bytes,
        cfg.block_size,
        cfg.ctx,
    )?;
    let view = ledger.view();
    let pool = lm.model.state_pool(
        &lm.backend,
        PoolSizes {
            block_size: cfg.block_size,
            n_blocks: view.kv_blocks,
            n_window_blocks: n_windows,
            n_slots,
        },
    )?;
    let disk = match &cfg.disk {
        Some((dir, bytes)) => {
            let key = DiskKey {
                model: lm.kv_identity.clone(),
                block_size: cfg.block_size,
                layout: layout.describe(&lm.backend),
                block_bytes: block_bytes as usize,
                tail_bytes: window_bytes as usize,
            };
            Some(DiskCache::open(dir, *bytes, key)?)
        }
        None => None,
    };
    let windows = match &layout {
        StateLayout::Compressed(c) => Some(paged::Windows {
            manager: windows::WindowManager::new(n_windows),
            slots: (0..n_slots as u32).rev().collect(),
            len: c.window,
        }),
        StateLayout::Kv(_) => None,
    };
    let kv = paged::PagedKv {
        pool,
        blocks: BlockManager::new(view.kv_blocks, cfg.block_size),
        windows,
        disk,
    };
    tracing::info!(
        budget_mb = view.budget_bytes >> 20,
        scratch_mb = view.scratch_bytes >> 20,
        sequence_mb = view.sequence_bytes >> 20,
        kv_blocks = view.kv_blocks,
        kv_tokens = view.kv_blocks * cfg.block_size,
        block_kb = view.kv_block_bytes >> 10,
        window_blocks = n_windows,
        max_seqs = cfg.max_seqs,
        batch_tokens = cfg.batch_tokens,
        layout = layout.describe(&lm.backend),
        "KV memory planned"
    );
    metrics
        .kv_tokens_capacity
        .set((view.kv_blocks * cfg.block_size) as i64);
    let ledger = Arc::new(Mutex::new(ledger));
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let waiting = Arc::new(AtomicUsize::new(0));
    let handle = EngineHandle {
        tx,
        waiting: waiting.clone(),
        ledger: ledger.clone(),
        metrics: metrics.clone(),
        ctx: cfg.ctx,
    };
    let thread = thread::Builder::new()
        .name("ds4-engine".into())
        .spawn(move || {
            let sched = scheduler::Scheduler::new(&lm, cfg, metrics, ledger, kv, waiting);
            sched.run(&mut rx);
        })
        .expect("spawn engine thread");
    Ok(Engine { handle, thread })
}
