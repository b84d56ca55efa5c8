//! Typed request fields several surfaces share: OpenAI's penalties and
//! logit bias (applied by the sampler), metadata, tool names. They are
//! read as the official APIs define them, so that a wrong-typed or
//! out-of-range value is a 400 naming the field instead of passing
//! silently. Unknown fields stay accepted, as those APIs accept them.

use std::collections::HashMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::ApiError;
use crate::sampler::SamplingParams;

/// `presence_penalty` / `frequency_penalty`: a number in [-2, 2].
#[derive(Clone, Copy, Debug)]
pub struct Penalty(pub f32);

impl<'de> Deserialize<'de> for Penalty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f32::deserialize(d)?;
        if !(-2.0..=2.0).contains(&v) {
            return Err(serde::de::Error::custom(format!(
                "{v} is out of range: a penalty is between -2 and 2"
            )));
        }
        Ok(Penalty(v))
    }
}

/// `logit_bias`: token ids (as JSON object keys) to biases in [-100, 100].
#[derive(Clone, Debug)]
pub struct LogitBias(pub HashMap<u32, f32>);

impl<'de> Deserialize<'de> for LogitBias {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = HashMap::<String, f32>::deserialize(d)?;
        let mut out = HashMap::with_capacity(map.len());
        for (k, v) in map {
            let id: u32 = k
                .parse()
                .map_err(|_| serde::de::Error::custom(format!("key {k:?} is not a token id")))?;
            if !(-100.0..=100.0).contains(&v) {
                return Err(serde::de::Error::custom(format!(
                    "the bias of token {id} ({v}) is out of range: a bias is between -100 and 100"
                )));
            }
            out.insert(id, v);
        }
        Ok(LogitBias(out))
    }
}

/// OpenAI's `metadata`: at most 16 string values, keys of at most 64
/// characters, values of at most 512; kept in the client's order (the
/// Responses API echoes it).
#[derive(Clone, Debug, Default, Serialize)]
#[serde(transparent)]
pub struct Metadata(pub Map<String, Value>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = Map::<String, Value>::deserialize(d)?;
        if map.len() > 16 {
            return Err(D::Error::custom("at most 16 pairs are allowed"));
        }
        for (k, v) in &map {
            if k.chars().count() > 64 {
                return Err(D::Error::custom(format!(
                    "key {k:?} is longer than 64 characters"
                )));
            }
            match v {
                Value::String(s) if s.chars().count() <= 512 => {}
                Value::String(_) => {
                    return Err(D::Error::custom(format!(
                        "the value of {k:?} is longer than 512 characters"
                    )))
                }
                _ => {
                    return Err(D::Error::custom(format!(
                        "the value of {k:?} is not a string"
                    )))
                }
            }
        }
        Ok(Metadata(map))
    }
}

/// Set OpenAI's `presence_penalty`, `frequency_penalty` and `logit_bias`
/// on `p`; the bias must name tokens of a vocabulary of `vocab`.
pub fn penalize(
    p: &mut SamplingParams,
    presence: Option<Penalty>,
    frequency: Option<Penalty>,
    bias: Option<LogitBias>,
    vocab: usize,
) -> Result<(), ApiError> {
    p.presence_penalty = presence.map_or(0.0, |x| x.0);
    p.frequency_penalty = frequency.map_or(0.0, |x| x.0);
    let mut bias: Vec<(u32, f32)> = bias.map(|b| b.0.into_iter().collect()).unwrap_or_default();
    bias.sort_by_key(|&(id, _)| id);
    if let Some(&(id, _)) = bias.iter().find(|&&(id, _)| id as usize >= vocab) {
        return Err(ApiError::bad(
            format!("logit_bias: token id {id} is outside the vocabulary of {vocab} tokens"),
            "logit_bias",
        ));
    }
    p.logit_bias = bias;
    Ok(())
}

/// A tool's name: not empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolName(pub String);

impl<'de> Deserialize<'de> for ToolName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.trim().is_empty() {
            return Err(serde::de::Error::custom("a tool's name must not be empty"));
        }
        Ok(ToolName(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Fields {
        presence_penalty: Option<Penalty>,
        logit_bias: Option<LogitBias>,
        metadata: Option<Metadata>,
        name: Option<ToolName>,
    }

    fn refusal(body: &str) -> (String, Option<String>) {
        crate::api::error::testing::refusal::<Fields>(body)
    }

    #[test]
    fn documented_fields_are_checked_by_type_and_range() {
        let ok: Fields = serde_json::from_str(
            r#"{"presence_penalty": -1.5, "logit_bias": {"50256": -100, "7": 3.5},
                "metadata": {"a": "b"}, "name": "get_weather"}"#,
        )
        .unwrap();
        assert_eq!(ok.logit_bias.unwrap().0[&7], 3.5);
        assert_eq!(ok.metadata.unwrap().0["a"], "b");
        let (m, p) = refusal(r#"{"presence_penalty": "x"}"#);
        assert_eq!(p.as_deref(), Some("presence_penalty"), "{m}");
        let (m, p) = refusal(r#"{"presence_penalty": 3}"#);
        assert!(m.contains("between -2 and 2"), "{m}");
        assert_eq!(p.as_deref(), Some("presence_penalty"));
        let (m, p) = refusal(r#"{"logit_bias": {"abc": 1}}"#);
        assert!(m.contains("\"abc\" is not a token id"), "{m}");
        assert_eq!(p.as_deref(), Some("logit_bias"));
        let (m, _) = refusal(r#"{"logit_bias": {"5": 101}}"#);
        assert!(m.contains("between -100 and 100"), "{m}");
        let (m, p) = refusal(r#"{"metadata": "x"}"#);
        assert_eq!(p.as_deref(), Some("metadata"), "{m}");
        let (m, _) = refusal(r#"{"metadata": {"a": 1}}"#);
        assert!(m.contains("not a string"), "{m}");
        let many: String = (0..17).map(|i| format!("\"k{i}\":\"v\",")).collect();
        let (m, _) = refusal(&format!(
            "{{\"metadata\": {{{}}}}}",
            many.trim_end_matches(',')
        ));
        assert!(m.contains("at most 16"), "{m}");
        let (m, p) = refusal(r#"{"name": " "}"#);
        assert!(m.contains("must not be empty"), "{m}");
        assert_eq!(p.as_deref(), Some("name"));
    }
}
