//! `--trace FILE`: what happened to every request on the engine's path,
//! one JSON object per line, for debugging an agent loop after the fact.
//! Each line has `ts` (Unix seconds), `request_id`, `path` and `event`:
//! - `prompt`: the prompt as the model reads it (`text`, its tokens
//!   decoded) and `prompt_tokens`;
//! - `tool_call_start` / `tool_call_end`: the tool parser found a call
//!   (`index`, `id`, `name`) and its end;
//! - `cache`: the prefix cache's decision (`cached_tokens`, the blocks
//!   reused from memory and disk, and `why` the reuse ends there);
//! - `answer`: `finish`, `completion_tokens`, `text`, `reasoning`,
//!   `calls` (with arguments) and `calls_cut` (calls the token limit cut
//!   short, left out of the answer);
//! - `failed` (`error`: the engine refused or failed it) or `dropped` (the
//!   client left before the end).
//!
//! Prompts are written whole: the file grows by about a prompt per
//! request, so this is for debugging sessions, not for every day.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ds4_model::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::run::{Collected, Delta, Finish};
use super::trace::{self, Tag};
use super::ApiError;

/// The trace file, appended to.
#[derive(Debug)]
pub struct TraceFile {
    path: PathBuf,
    out: Mutex<BufWriter<File>>,
    /// A write failed (logged once; tracing goes on trying).
    failed: AtomicBool,
}

impl TraceFile {
    /// Open `path` for appending (created if missing).
    pub fn open(path: &Path) -> std::io::Result<TraceFile> {
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(TraceFile {
            path: path.to_path_buf(),
            out: Mutex::new(BufWriter::new(f)),
            failed: AtomicBool::new(false),
        })
    }

    /// Append one event of request `tag`; `fields` (an object) follow the
    /// common ones.
    pub fn write(&self, tag: &Tag, event: &str, fields: Value) {
        let mut line = Map::new();
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        line.insert("ts".into(), ts.into());
        line.insert("request_id".into(), tag.id.clone().into());
        line.insert("path".into(), tag.path.clone().into());
        line.insert("event".into(), event.into());
        if let Value::Object(f) = fields {
            line.extend(f);
        }
        let mut text = Value::Object(line).to_string();
        text.push('\n');
        let mut out = self.out.lock().expect("trace file");
        let r = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        if let Err(e) = r {
            if !self.failed.swap(true, Ordering::Relaxed) {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot write the trace file");
            }
        }
    }
}

/// Where a run's trace records go, and whether its end was written.
pub struct RunTrace {
    file: Arc<TraceFile>,
    tag: Tag,
    ended: bool,
}

impl RunTrace {
    /// Write the `prompt` record of a request about to be queued (tagged
    /// with the handler's request, `-` outside one).
    pub fn prompt(file: &Arc<TraceFile>, prompt: &[u32], tok: &Tokenizer) -> RunTrace {
        let tag = trace::current().unwrap_or_else(|| Tag {
            id: "-".into(),
            path: "-".into(),
        });
        file.write(
            &tag,
            "prompt",
            json!({"prompt_tokens": prompt.len(), "text": tok.decode(prompt)}),
        );
        RunTrace {
            file: file.clone(),
            tag,
            ended: false,
        }
    }

    fn write(&self, event: &str, fields: serde_json::Value) {
        self.file.write(&self.tag, event, fields);
    }

    pub fn deltas(&self, ds: &[Delta]) {
        for d in ds {
            match d {
                Delta::CallStart { index, id, name } => self.write(
                    "tool_call_start",
                    json!({"index": index, "id": id, "name": name}),
                ),
                Delta::CallEnd => self.write("tool_call_end", json!({})),
                _ => {}
            }
        }
    }

    pub fn done(&mut self, c: &Collected, f: &Finish) {
        let p = &f.timings.prefix;
        self.write(
            "cache",
            json!({"prompt_tokens": f.prompt_tokens(), "cached_tokens": f.timings.cached_tokens,
                   "block_size": p.block_size, "resumable_blocks": p.resumable,
                   "memory_blocks": p.memory, "disk_blocks": p.disk, "why": p.why()}),
        );
        let calls: Vec<_> = c
            .calls
            .iter()
            .map(|k| json!({"id": k.id, "name": k.name, "arguments": k.arguments}))
            .collect();
        self.write(
            "answer",
            json!({"finish": format!("{:?}", f.reason).to_lowercase(),
                   "completion_tokens": f.completion_tokens(), "text": c.text,
                   "reasoning": c.reasoning, "calls": calls,
                   "calls_cut": c.calls.len().saturating_sub(f.calls)}),
        );
        self.ended = true;
    }

    pub fn failed(&mut self, e: &ApiError) {
        self.write("failed", json!({"error": e.to_string()}));
        self.ended = true;
    }
}

impl Drop for RunTrace {
    fn drop(&mut self) {
        if !self.ended {
            self.write("dropped", json!({}));
        }
    }
}
