//! Bounds a JSON schema leaves open that a sampled answer must not run
//! into: JSON allows any amount of whitespace between tokens and any
//! number of digits in a number, so a small model at a high temperature
//! can loop on blanks or digits until its token limit, and its answer
//! then fails to parse. Like llama.cpp's JSON grammars, ds4 bounds both:
//! - whitespace between tokens: at most a line break and an indent of 20
//!   blanks (the schema's own `x-guidance` options win);
//! - numbers: at most [`FRACTION_DIGITS`] digits after the point, and an
//!   integer part below 10^15, where the schema says nothing itself (a
//!   `multipleOf`, a `minimum` or a `maximum` of its own is kept).
//!
//! llama.cpp allows 16 digits on either side; the fraction here stops at
//! 8 because the grammar library counts a number's digits in 32 bits.

use serde_json::{Map, Value};

/// The whitespace a JSON answer may put between two tokens.
const JSON_WHITESPACE: &str = r"[\x20\x09]{1,20}|\x0D?\x0A[\x20\x09]{0,20}";

/// Digits a number may carry after its decimal point.
pub const FRACTION_DIGITS: i32 = 8;

/// The largest integer part a number may have where its schema gives no
/// bound of its own.
pub const INTEGER_BOUND: i64 = 999_999_999_999_999;

/// `schema` with the bounds above added.
pub fn bounded(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    bound_numbers(&mut s);
    s
}

/// Keywords whose value is a map of names to subschemas.
const SCHEMA_MAPS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is a subschema (or, for `items`, a list of them).
const SCHEMAS: &[&str] = &[
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];

/// Keywords whose value is a list of subschemas.
const SCHEMA_LISTS: &[&str] = &["anyOf", "allOf", "oneOf", "prefixItems"];

/// Add the number bounds to `schema` and every subschema in it (values of
/// `const`, `enum`, `default` and `examples` are data, left alone).
fn bound_numbers(schema: &mut Value) {
    let Some(o) = schema.as_object_mut() else {
        return;
    };
    if takes(o, "number") || takes(o, "integer") {
        if takes(o, "number") && !o.contains_key("multipleOf") {
            o.insert(
                "multipleOf".into(),
                serde_json::json!(10f64.powi(-FRACTION_DIGITS)),
            );
        }
        if !o.contains_key("minimum") && !o.contains_key("exclusiveMinimum") {
            o.insert("minimum".into(), (-INTEGER_BOUND).into());
        }
        if !o.contains_key("maximum") && !o.contains_key("exclusiveMaximum") {
            o.insert("maximum".into(), INTEGER_BOUND.into());
        }
    }
    for (k, v) in o.iter_mut() {
        let k = k.as_str();
        if SCHEMA_MAPS.contains(&k) {
            if let Some(m) = v.as_object_mut() {
                m.values_mut().for_each(bound_numbers);
            }
        } else if SCHEMAS.contains(&k) || SCHEMA_LISTS.contains(&k) {
            match v {
                Value::Array(list) => list.iter_mut().for_each(bound_numbers),
                v => bound_numbers(v),
            }
        }
    }
}

/// Whether the schema object's `type` is `kind` or a list naming it.
fn takes(o: &Map<String, Value>, kind: &str) -> bool {
    match o.get("type") {
        Some(Value::String(t)) => t == kind,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == kind),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_get_digit_bounds_where_the_schema_gives_none() {
        let s = bounded(&json!({
            "type": "object",
            "properties": {
                "score": {"type": "number", "minimum": 0, "maximum": 10},
                "price": {"type": ["number", "null"]},
                "count": {"type": "integer", "exclusiveMinimum": 0},
                "step": {"type": "number", "multipleOf": 0.5},
                "list": {"type": "array", "items": {"type": "number"}},
                "either": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/n"}]},
                "const": {"const": {"type": "number"}}
            },
            "$defs": {"n": {"type": "number"}}
        }));
        let p = &s["properties"];
        let tiny = json!(1e-8);
        assert_eq!(p["score"]["multipleOf"], tiny);
        assert_eq!(p["score"]["minimum"], 0);
        assert_eq!(p["score"]["maximum"], 10);
        assert_eq!(p["price"]["multipleOf"], tiny);
        assert_eq!(p["price"]["minimum"], -INTEGER_BOUND);
        assert_eq!(p["price"]["maximum"], INTEGER_BOUND);
        assert!(p["count"].get("multipleOf").is_none());
        assert!(p["count"].get("minimum").is_none());
        assert_eq!(p["count"]["maximum"], INTEGER_BOUND);
        assert_eq!(p["step"]["multipleOf"], 0.5);
        assert_eq!(p["list"]["items"]["multipleOf"], tiny);
        assert_eq!(p["either"]["anyOf"][0]["maximum"], INTEGER_BOUND);
        assert_eq!(s["$defs"]["n"]["multipleOf"], tiny);
        // A property named like a keyword is still a schema; a const's
        // value is data.
        assert_eq!(p["const"]["const"], json!({"type": "number"}));
        assert!(s["x-guidance"]["whitespace_pattern"].is_string());
    }

    #[test]
    fn a_schema_with_its_own_options_keeps_them() {
        let own = json!({"type": "object", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(bounded(&own)["x-guidance"], own["x-guidance"]);
    }
}
