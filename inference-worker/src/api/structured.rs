//! Structured output on the wire: each API's way of asking for a JSON
//! answer (Chat's `response_format`, Responses' `text.format`, Anthropic's
//! `output_config.format`) and the raw-grammar extension of Chat and
//! Completions, turned into a [`Spec`] and compiled into the request's
//! [`Constraint`] (a schema the library refuses is a 400 naming the field).

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{ApiError, AppState};
use crate::grammar::{Constraint, Spec};
use ds4_model::chat::AnswerFormat;

/// Chat Completions' `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`.
#[derive(Debug, Deserialize)]
pub struct JsonSchemaFormat {
    #[allow(dead_code)]
    pub name: String,
    /// Absent: any JSON object.
    pub schema: Option<Map<String, Value>>,
    /// Accepted; the schema is always enforced.
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    pub fn spec(self) -> Option<Spec> {
        match self {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(Spec::json_object()),
            ResponseFormat::JsonSchema { json_schema } => Some(schema_spec(json_schema.schema)),
        }
    }
}

/// Responses' `text.format` (the schema's fields sit beside `type`; as
/// on OpenAI's service, `json_schema` needs its `name` and `schema`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        #[allow(dead_code)]
        name: String,
        schema: Map<String, Value>,
        #[allow(dead_code)]
        strict: Option<bool>,
    },
}

impl TextFormat {
    pub fn spec(self) -> Option<Spec> {
        match self {
            TextFormat::Text => None,
            TextFormat::JsonObject => Some(Spec::json_object()),
            TextFormat::JsonSchema { schema, .. } => Some(Spec::JsonSchema(Value::Object(schema))),
        }
    }
}

/// Anthropic's `output_config.format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    JsonSchema { schema: Map<String, Value> },
}

impl OutputFormat {
    pub fn spec(self) -> Spec {
        match self {
            OutputFormat::JsonSchema { schema } => Spec::JsonSchema(Value::Object(schema)),
        }
    }
}

fn schema_spec(schema: Option<Map<String, Value>>) -> Spec {
    schema.map_or_else(Spec::json_object, |s| Spec::JsonSchema(Value::Object(s)))
}

/// The raw-grammar extension (Chat and Completions): a Lark grammar as a
/// string, or `{"syntax": "lark" | "regex", "definition": ...}`.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a Lark grammar, or {\"syntax\": \"lark\" | \"regex\", \"definition\": ...}"
)]
pub enum WireGrammar {
    Lark(String),
    Tagged {
        syntax: GrammarSyntax,
        definition: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrammarSyntax {
    Lark,
    Regex,
}

impl WireGrammar {
    pub fn spec(self) -> Spec {
        match self {
            WireGrammar::Lark(l)
            | WireGrammar::Tagged {
                syntax: GrammarSyntax::Lark,
                definition: l,
            } => Spec::Lark(l),
            WireGrammar::Tagged {
                syntax: GrammarSyntax::Regex,
                definition: r,
            } => Spec::Regex(r),
        }
    }
}

/// At most one way of constraining the answer.
pub fn one_spec(
    specs: impl IntoIterator<Item = (Option<Spec>, &'static str)>,
) -> Result<Option<(Spec, &'static str)>, ApiError> {
    let mut found: Option<(Spec, &'static str)> = None;
    for (spec, param) in specs {
        let Some(spec) = spec else { continue };
        if let Some((_, first)) = &found {
            return Err(ApiError::bad(
                format!("{first} and {param} both constrain the answer; send one"),
                param,
            ));
        }
        found = Some((spec, param));
    }
    Ok(found)
}

/// The constraint of an answer read as `answer` says: its calls held to
/// their syntax and strict schemas when the prompt's rendering asks for it
/// (a forced call, strict tools), its content to `spec` (from the request
/// field `param`); its reasoning stays free. Compiled off the async
/// threads.
pub async fn compile(
    state: &Arc<AppState>,
    spec: Option<(Spec, &'static str)>,
    answer: &AnswerFormat,
) -> Result<Option<Constraint>, ApiError> {
    let (spec, content, param) = match (&answer.calls, spec) {
        (None, None) => return Ok(None),
        (None, Some((spec, param))) => (spec, None, param),
        // A forced call: the answer is calls, whatever the content format.
        (Some(calls), _) if calls.forced() => (Spec::Lark(calls.lark(None)), None, "tools"),
        (Some(calls), None) => (Spec::Lark(calls.lark(None)), None, "tools"),
        (Some(calls), Some((content, param))) => (
            Spec::Lark(calls.lark(Some("@content"))),
            Some(content),
            param,
        ),
    };
    let Some(grammars) = state.grammars.clone() else {
        return Err(ApiError::bad(
            "structured output is not available for this model's vocabulary",
            param,
        ));
    };
    let reasoning = answer.reasoning;
    let compiled = tokio::task::spawn_blocking(move || {
        grammars.compile(&spec, content.as_ref(), reasoning.as_ref())
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    compiled
        .map(Some)
        .map_err(|e| ApiError::bad(format!("{param} cannot be enforced: {e}"), param))
}
