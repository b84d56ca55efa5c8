//! The continuation registry: an agent that sends only a tool result (an
//! Anthropic Messages request whose messages are just the `tool_result`
//! blocks, a Responses request with `previous_response_id` and the
//! `function_call_output` items) continues the conversation that produced
//! those calls, as this server rendered it: the prompt is the earlier
//! conversation, its answer and the new items, so the prefix cache holds
//! all but the new turn.
//!
//! A conversation that ends with tool calls is kept under each call id
//! and its response id (all unguessable: 24 random hex digits) for
//! [`TTL`]; once a follow-up continued it, for a [`GRACE`] window more
//! (a client's retry). A follow-up continues only on an exact match: its
//! results answer exactly the calls of that turn, and its tools and
//! system text equal the kept ones; anything else is a 409 asking for the
//! whole history.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ds4_model::chat::{Conversation, Role, Turn};

use super::run::Collected;
use super::ApiError;

/// How long a conversation waits for its follow-up.
pub const TTL: Duration = Duration::from_secs(30 * 60);
/// How long it stays once continued.
pub const GRACE: Duration = Duration::from_secs(60);
/// Conversations kept at most (the oldest go first).
pub const MAX_KEPT: usize = 256;

struct Kept {
    convo: Arc<Conversation>,
    expires: Instant,
}

#[derive(Default)]
pub struct Registry {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<String, Arc<Mutex<Kept>>>,
    order: VecDeque<Vec<String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registry")
    }
}

impl Registry {
    /// Keep `convo` followed by the answer `c` when the answer made
    /// calls, under their ids and `response_id`.
    pub fn remember(&self, mut convo: Conversation, c: &Collected, response_id: Option<&str>) {
        if c.calls.is_empty() {
            return;
        }
        let mut turn = Turn::new(Role::Assistant, c.text.clone());
        turn.reasoning = (!c.reasoning.is_empty()).then(|| c.reasoning.clone());
        turn.calls = c.calls.clone();
        convo.turns.push(turn);
        let keys: Vec<String> = c
            .calls
            .iter()
            .map(|k| k.id.clone())
            .chain(response_id.map(str::to_string))
            .collect();
        let kept = Arc::new(Mutex::new(Kept {
            convo: Arc::new(convo),
            expires: Instant::now() + TTL,
        }));
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for k in &keys {
            inner.by_key.insert(k.clone(), kept.clone());
        }
        inner.order.push_back(keys);
        while inner.order.len() > MAX_KEPT {
            if let Some(old) = inner.order.pop_front() {
                old.iter().for_each(|k| {
                    inner.by_key.remove(k);
                });
            }
        }
    }

    /// The kept conversation under `key`, continued by `follow`, whose
    /// leading tool results answer the calls `answered` (by id, in
    /// order). `param` names the request field a 409 points at.
    pub fn resume(
        &self,
        key: &str,
        answered: &[String],
        follow: Conversation,
        param: &'static str,
    ) -> Result<Conversation, ApiError> {
        let conflict = |why: &str| {
            ApiError::Conflict {
            message: format!(
                "this request continues an earlier turn ({why}); send the whole conversation instead"
            ),
            param,
        }
        };
        let kept = {
            let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            inner.by_key.get(key).cloned()
        };
        let Some(kept) = kept else {
            return Err(conflict(&format!("{key:?} is not held by this server")));
        };
        let base = {
            let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if k.expires <= now {
                return Err(conflict(&format!("{key:?} has expired")));
            }
            k.expires = k.expires.min(now + GRACE);
            k.convo.clone()
        };
        let calls: Vec<&str> = base
            .turns
            .last()
            .map(|t| t.calls.iter().map(|c| c.id.as_str()).collect())
            .unwrap_or_default();
        if calls != answered.iter().map(String::as_str).collect::<Vec<_>>() {
            return Err(conflict(&format!(
                "its tool results answer {answered:?}, the turn made the calls {calls:?}"
            )));
        }
        let system = |c: &Conversation| -> Vec<String> {
            c.turns
                .iter()
                .take_while(|t| t.role == Role::System)
                .map(|t| t.text.clone())
                .collect()
        };
        let same_tools = base.tools.len() == follow.tools.len()
            && base
                .tools
                .iter()
                .zip(&follow.tools)
                .all(|(a, b)| a.name == b.name && a.parameters == b.parameters);
        if !same_tools || system(&base) != system(&follow) {
            return Err(conflict(
                "its tools or system text differ from the earlier turn's",
            ));
        }
        let mut convo = (*base).clone();
        let skip = system(&follow).len();
        convo.turns.extend(follow.turns.into_iter().skip(skip));
        convo.tools = follow.tools;
        convo.choice = follow.choice;
        convo.thinking = follow.thinking;
        convo.single_call = follow.single_call;
        Ok(convo)
    }
}
