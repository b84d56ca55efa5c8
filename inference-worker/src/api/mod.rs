//! HTTP surfaces. Each API has its own module with its own serde wire
//! types; [`ApiError`] is the one internal error, rendered in each API's
//! envelope. Only this module knows OpenAI/Anthropic JSON.

mod error;
mod models;
mod openai_chat;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::engine::EngineHandle;
use crate::runtime::Prompter;
pub use error::ApiError;

/// Largest request body accepted (a long agent conversation fits easily).
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What every handler can see.
pub struct AppState {
    pub engine: EngineHandle,
    pub prompter: Prompter,
    pub model_id: String,
    /// Tokens a request may occupy (prompt + completion).
    pub ctx: usize,
    /// Unix time the server started, reported as the model's `created`.
    pub created: u64,
    pub started: Instant,
}

impl AppState {
    pub fn new(engine: EngineHandle, prompter: Prompter, model_id: String, ctx: usize) -> AppState {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        AppState {
            engine,
            prompter,
            model_id,
            ctx,
            created,
            started: Instant::now(),
        }
    }

    /// Whether `requested` names the loaded model (or one of its aliases).
    pub fn serves(&self, requested: &str) -> bool {
        requested.is_empty() || requested == self.model_id || requested == "default"
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(openai_chat::handle))
        .route("/v1/models", get(models::list))
        .route("/health", get(models::health))
        .fallback(error::not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}
