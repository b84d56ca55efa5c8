//! Server metrics, exposed as Prometheus text on `GET /metrics` and as a
//! JSON summary on `GET /v1/stats`. The engine records token counts,
//! latencies and sequence state; the API records requests and refusals.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Every metric the worker keeps.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<Labels, Counter>,
    pub refusals: Family<Labels, Counter>,
    pub prompt_tokens: Counter,
    pub cached_tokens: Counter,
    pub generated_tokens: Counter,
    pub cancelled: Counter,
    pub ttft: Histogram,
    pub token_latency: Histogram,
    pub decode_tps: Gauge<f64, AtomicU64>,
    pub queue_depth: Gauge,
    pub active_sequences: Gauge,
    pub kv_tokens_used: Gauge,
    pub kv_tokens_capacity: Gauge,
    pub kv_blocks_used: Gauge,
    pub kv_blocks_cached: Gauge,
    pub connections_open: Gauge,
    pub connections_closed: Family<Labels, Counter>,
    pub accept_errors: Counter,
    /// Tools-armed turns that ended with `stop` and no tool call.
    pub tool_slips: Counter,
    /// Those drawn once more (`--tool-slip-resample`).
    pub tool_slip_resamples: Counter,
    /// All requests counted by [`Metrics::request`] (families cannot be
    /// summed without iterating them).
    requests_total: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ds4");
        let m = Metrics {
            requests: Family::default(),
            refusals: Family::default(),
            prompt_tokens: Counter::default(),
            cached_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            cancelled: Counter::default(),
            ttft: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            token_latency: Histogram::new(exponential_buckets(0.001, 2.0, 12)),
            decode_tps: Gauge::default(),
            queue_depth: Gauge::default(),
            active_sequences: Gauge::default(),
            kv_tokens_used: Gauge::default(),
            kv_tokens_capacity: Gauge::default(),
            kv_blocks_used: Gauge::default(),
            kv_blocks_cached: Gauge::default(),
            connections_open: Gauge::default(),
            connections_closed: Family::default(),
            accept_errors: Counter::default(),
            tool_slips: Counter::default(),
            tool_slip_resamples: Counter::default(),
            registry: Registry::default(),
            requests_total: AtomicU64::new(0),
        };
        let r = &mut registry;
        r.register(
            "requests",
            "Finished HTTP requests by API surface and outcome",
            m.requests.clone(),
        );
        r.register(
            "tool_slips",
            "Tools-armed turns that ended with stop and no tool call",
            m.tool_slips.clone(),
        );
        r.register(
            "tool_slip_resamples",
            "Tool slips drawn once more before the client saw them (--tool-slip-resample)",
            m.tool_slip_resamples.clone(),
        );
        r.register(
            "refusals",
            "Requests refused, by reason",
            m.refusals.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens of finished generations",
            m.prompt_tokens.clone(),
        );
        r.register(
            "cached_tokens",
            "Prompt tokens served from the KV cache",
            m.cached_tokens.clone(),
        );
        r.register(
            "generated_tokens",
            "Tokens generated",
            m.generated_tokens.clone(),
        );
        r.register(
            "cancelled_generations",
            "Generations stopped because the client went away",
            m.cancelled.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "Time from engine start of a request to its first token",
            m.ttft.clone(),
        );
        r.register(
            "token_latency_seconds",
            "Mean decode time per generated token, one sample per request",
            m.token_latency.clone(),
        );
        r.register(
            "decode_tokens_per_second",
            "Decode speed of the last finished generation",
            m.decode_tps.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for the engine",
            m.queue_depth.clone(),
        );
        r.register(
            "active_sequences",
            "Sequences being generated",
            m.active_sequences.clone(),
        );
        r.register(
            "kv_tokens_used",
            "Tokens held in the KV cache",
            m.kv_tokens_used.clone(),
        );
        r.register(
            "kv_tokens_capacity",
            "Tokens the KV cache can hold",
            m.kv_tokens_capacity.clone(),
        );
        r.register(
            "kv_blocks_used",
            "KV blocks held by running sequences",
            m.kv_blocks_used.clone(),
        );
        r.register(
            "kv_blocks_cached",
            "Idle KV blocks kept for prefix reuse",
            m.kv_blocks_cached.clone(),
        );
        r.register(
            "connections_open",
            "Open HTTP connections",
            m.connections_open.clone(),
        );
        r.register(
            "connections_closed",
            "HTTP connections closed or refused by the server, by reason",
            m.connections_closed.clone(),
        );
        r.register(
            "accept_errors",
            "Failed accepts of HTTP connections (e.g. out of file descriptors)",
            m.accept_errors.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Count a finished request of `surface` (`chat`, `completions`,
    /// `responses`, `messages`, ...) with `outcome` (`ok`, `error`,
    /// `cancelled`, or a refusal reason).
    pub fn request(&self, surface: &str, outcome: &str) {
        self.requests
            .get_or_create(&vec![
                ("surface".into(), surface.into()),
                ("outcome".into(), outcome.into()),
            ])
            .inc();
        self.requests_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn refusal(&self, reason: &str) {
        self.refusals
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    /// Count a connection the listener closed or refused, by `reason`
    /// (`header_timeout`, `idle_timeout`, `evicted`, `refused`).
    pub fn connection_closed(&self, reason: &str) {
        self.connections_closed
            .get_or_create(&vec![("reason".into(), reason.into())])
            .inc();
    }

    pub fn accept_error(&self) {
        self.accept_errors.inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    /// Totals for `/v1/stats`.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            requests: self.requests_total.load(Ordering::Relaxed),
            prompt_tokens: self.prompt_tokens.get(),
            cached_tokens: self.cached_tokens.get(),
            generated_tokens: self.generated_tokens.get(),
            cancelled: self.cancelled.get(),
            decode_tokens_per_s: self.decode_tps.get(),
            queue_depth: self.queue_depth.get(),
            active_sequences: self.active_sequences.get(),
            kv_tokens_used: self.kv_tokens_used.get(),
            kv_tokens_capacity: self.kv_tokens_capacity.get(),
            kv_blocks_used: self.kv_blocks_used.get(),
            kv_blocks_cached: self.kv_blocks_cached.get(),
        }
    }
}

/// Totals at one moment.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Snapshot {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub generated_tokens: u64,
    pub cancelled: u64,
    pub decode_tokens_per_s: f64,
    pub queue_depth: i64,
    pub kv_blocks_used: i64,
    pub kv_blocks_cached: i64,
    pub active_sequences: i64,
    pub kv_tokens_used: i64,
    pub kv_tokens_capacity: i64,
}
