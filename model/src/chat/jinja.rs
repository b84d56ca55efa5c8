//! The Jinja environment `transformers` renders chat templates in, rebuilt
//! for minijinja: `trim_blocks` and `lstrip_blocks` on, Python string and
//! dict methods (`.strip()`, `.startswith()`, `.items()`, via
//! minijinja-contrib's pycompat), and the globals and filters templates
//! call: `raise_exception`, `strftime_now`, and a `tojson` that writes what
//! Python's `json.dumps` writes (`", "` and `": "` separators, no HTML
//! escaping, non-ASCII kept).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// Marks an error raised by the template itself through `raise_exception`.
#[derive(Debug)]
pub(crate) struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

/// An environment configured like `transformers`' chat template sandbox.
pub(crate) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

/// `strftime_now(format)`: the current time (UTC) formatted as Python's
/// `datetime.strftime` would.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs as i64)
}

/// Format a Unix time (UTC) with the common `strftime` directives.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('j') => write!(out, "{day_of_year:03}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') | Some('h') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{}", DAYS[weekday]),
            Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) -> days since 1970-01-01.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `value|tojson(indent=None, sort_keys=False, separators=None)` as
/// Python's `json.dumps(value, ensure_ascii=False, ...)` writes it.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            _ => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators = kwargs.get::<Option<Vec<String>>>("separators")?;
    let _ = kwargs.get::<Option<bool>>("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    write_json(value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonStyle {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    }
}

fn json_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).expect("a str always serializes"));
}

fn write_json(
    value: &Value,
    style: &JsonStyle,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let s = serde_json::to_string(value)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
            out.push_str(&s);
        }
        ValueKind::String => json_string(value.as_str().unwrap_or_default(), out),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort();
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                style.newline(level + 1, out);
                match key.as_str() {
                    Some(k) => json_string(k, out),
                    None => json_string(&key.to_string(), out),
                }
                out.push_str(&style.key_sep);
                write_json(&value.get_item(key)?, style, level + 1, out)?;
            }
            style.newline(level, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                style.newline(level + 1, out);
                write_json(item, style, level + 1, out)?;
            }
            style.newline(level, out);
            out.push(']');
        }
        _ => json_string(&value.to_string(), out),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let env = environment();
        env.render_str(src, ctx).unwrap()
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let ctx = serde_json::json!({"v": {"name": "f<x>", "n": [1, 2.5, true, null], "e": {}, "s": "é\n"}});
        // Python: json.dumps(v, ensure_ascii=False) keeps insertion order.
        assert_eq!(
            render("{{ v|tojson }}", ctx.clone()),
            r#"{"name": "f<x>", "n": [1, 2.5, true, null], "e": {}, "s": "é\n"}"#
        );
        assert_eq!(
            render("{{ v.n|tojson(indent=2) }}", ctx),
            "[\n  1,\n  2.5,\n  true,\n  null\n]"
        );
    }

    #[test]
    fn python_methods_and_trimming() {
        let ctx = serde_json::json!({"s": "  Hi there "});
        assert_eq!(
            render("{{ s.strip() }}|{{ s.split()|length }}", ctx.clone()),
            "Hi there|2"
        );
        assert_eq!(
            render(
                "{% if s.strip().startswith('Hi') %}\n  yes\n{% endif %}",
                ctx
            ),
            "  yes\n"
        );
    }

    #[test]
    fn raise_exception_carries_the_message() {
        let env = environment();
        let err = env
            .render_str("{{ raise_exception('roles must alternate') }}", ())
            .unwrap_err();
        let raised = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<Raised>());
        assert_eq!(raised.map(|r| r.0.as_str()), Some("roles must alternate"));
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y, %A %j %I%p %%", t),
            "29 Feb 2024, Thursday 060 01PM %"
        );
        assert_eq!(strftime("%B %e", 0), "January  1");
    }
}
