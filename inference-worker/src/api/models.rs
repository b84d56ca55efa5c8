//! `GET /v1/models` and `GET /health`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;

use super::{ApiError, AppState};

#[derive(Serialize)]
pub struct ModelList {
    object: &'static str,
    data: Vec<ModelCard>,
}

#[derive(Serialize)]
pub struct ModelCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
}

pub async fn list(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.model_id.clone(),
            object: "model",
            created: state.created,
            owned_by: "ds4",
        }],
    })
}

/// `GET /v1/models/{id}`: the loaded model under any name it answers to.
pub async fn one(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    if !state.serves(&id) {
        return Err(ApiError::UnknownModel(id));
    }
    Ok(Json(ModelCard {
        id,
        object: "model",
        created: state.created,
        owned_by: "ds4",
    }))
}

#[derive(Serialize)]
pub struct Health {
    status: &'static str,
    model: String,
    queue_depth: usize,
    uptime_s: u64,
    /// `standalone`, `owner` or `owner_gone`.
    weights: &'static str,
}

pub async fn health(State(state): State<Arc<AppState>>) -> Json<Health> {
    Json(Health {
        status: "ok",
        model: state.model_id.clone(),
        queue_depth: state.engine.queue_depth(),
        uptime_s: state.started.elapsed().as_secs(),
        weights: state.weights(),
    })
}
