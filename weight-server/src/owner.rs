//! The owner's lease book and life cycle: attach, keep-alive, detach,
//! drain, reaping, events. The gRPC service and the broker only call in.
//! Starting a whole owner, [`Owner::start`], lives in [`crate::start`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ds4_proto::manifest::{RegionEntry, SCOPE_BASE};
use tokio::sync::{broadcast, watch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerState {
    Loading,
    Ready,
    Draining,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    Ready,
    Draining,
    ShuttingDown,
}

#[derive(Clone, Debug)]
pub struct Event {
    pub kind: EventKind,
    pub generation: u64,
    pub message: String,
}

/// What was loaded, as the control plane reports it.
#[derive(Clone, Debug)]
pub struct Identity {
    pub layout_identity: String,
    pub content_identity: String,
    pub backend: String,
    pub bytes_resident: u64,
    pub generation: u64,
    pub regions: Vec<RegionEntry>,
}

#[derive(Clone, Debug)]
pub struct LeaseInfo {
    pub lease_id: String,
    pub worker_id: String,
    pub pid: u32,
    pub scope: String,
    pub age: Duration,
    pub since_keepalive: Duration,
}

#[derive(Clone, Debug)]
pub struct StatusSnapshot {
    pub state: OwnerState,
    pub identity: Identity,
    pub leases: Vec<LeaseInfo>,
    pub load_count: u64,
    pub reaped: u64,
    pub uptime: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AttachError {
    #[error("the weight owner is draining and accepts no new workers; start workers against a new owner")]
    Draining,
    #[error("unknown scope {found:?}; this owner holds: {have}")]
    UnknownScope { found: String, have: String },
    #[error("layout identity mismatch: the worker's model file has {worker}, the owner holds {owner}; start the worker with the owner's model file (-m)")]
    Identity { worker: String, owner: String },
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("unknown lease {0:?} (expired or reaped); attach again")]
pub struct UnknownLease(pub String);

struct Lease {
    worker_id: String,
    pid: u32,
    scope: String,
    created: Instant,
    last: Instant,
}

struct Inner {
    state: OwnerState,
    leases: HashMap<String, Lease>,
    reaped: u64,
    next_lease: u64,
    exit_when_idle: bool,
}

pub struct Owner {
    identity: Identity,
    inner: Mutex<Inner>,
    started: Instant,
    lease_timeout: Duration,
    events: broadcast::Sender<Event>,
    shutdown: watch::Sender<bool>,
}

impl Owner {
    /// A ready owner (the weights are uploaded when this is built).
    pub fn new(identity: Identity, lease_timeout: Duration) -> Owner {
        let (events, _) = broadcast::channel(64);
        let (shutdown, _) = watch::channel(false);
        Owner {
            identity,
            inner: Mutex::new(Inner {
                state: OwnerState::Ready,
                leases: HashMap::new(),
                reaped: 0,
                next_lease: 1,
                exit_when_idle: false,
            }),
            started: Instant::now(),
            lease_timeout,
            events,
            shutdown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    pub fn lease_timeout(&self) -> Duration {
        self.lease_timeout
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn emit(&self, kind: EventKind, message: &str) {
        let _ = self.events.send(Event {
            kind,
            generation: self.identity.generation,
            message: message.to_string(),
        });
    }

    /// Resolves once the owner should exit (signal or drained).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    pub fn request_shutdown(&self, why: &str) {
        tracing::info!(reason = why, "shutting down");
        self.emit(EventKind::ShuttingDown, why);
        self.shutdown.send_replace(true);
    }

    pub fn attach(
        &self,
        worker_id: &str,
        pid: u32,
        scope: &str,
        expected_layout_identity: &str,
    ) -> Result<(String, Vec<RegionEntry>), AttachError> {
        let mut inner = self.lock();
        if inner.state == OwnerState::Draining {
            return Err(AttachError::Draining);
        }
        if scope != SCOPE_BASE {
            return Err(AttachError::UnknownScope {
                found: scope.into(),
                have: SCOPE_BASE.into(),
            });
        }
        if !expected_layout_identity.is_empty()
            && expected_layout_identity != self.identity.layout_identity
        {
            return Err(AttachError::Identity {
                worker: expected_layout_identity.into(),
                owner: self.identity.layout_identity.clone(),
            });
        }
        let id = format!("lease-{}-{}", self.identity.generation, inner.next_lease);
        inner.next_lease += 1;
        let now = Instant::now();
        inner.leases.insert(
            id.clone(),
            Lease {
                worker_id: worker_id.into(),
                pid,
                scope: scope.into(),
                created: now,
                last: now,
            },
        );
        tracing::info!(lease_id = %id, worker_id, pid, scope, "worker attached");
        Ok((id, self.identity.regions.clone()))
    }

    pub fn keep_alive(&self, lease_id: &str) -> Result<OwnerState, UnknownLease> {
        let mut inner = self.lock();
        let state = inner.state;
        let lease = inner
            .leases
            .get_mut(lease_id)
            .ok_or_else(|| UnknownLease(lease_id.into()))?;
        lease.last = Instant::now();
        Ok(state)
    }

    /// The scope of a live lease (the broker's check).
    pub fn lease_scope(&self, lease_id: &str) -> Result<String, UnknownLease> {
        self.lock()
            .leases
            .get(lease_id)
            .map(|l| l.scope.clone())
            .ok_or_else(|| UnknownLease(lease_id.into()))
    }

    pub fn detach(&self, lease_id: &str) -> Result<(), UnknownLease> {
        let removed = self.lock().leases.remove(lease_id);
        match removed {
            Some(l) => {
                tracing::info!(lease_id, worker_id = %l.worker_id, pid = l.pid, "worker detached");
                self.maybe_exit_idle();
                Ok(())
            }
            None => Err(UnknownLease(lease_id.into())),
        }
    }

    /// Refuse new attaches; with `exit_when_idle`, exit once no lease is left.
    pub fn drain(&self, exit_when_idle: bool) -> usize {
        let n = {
            let mut inner = self.lock();
            inner.state = OwnerState::Draining;
            inner.exit_when_idle |= exit_when_idle;
            inner.leases.len()
        };
        tracing::info!(leases = n, exit_when_idle, "draining");
        self.emit(EventKind::Draining, "draining: no new workers are accepted");
        self.maybe_exit_idle();
        n
    }

    fn maybe_exit_idle(&self) {
        let exit = {
            let inner = self.lock();
            inner.exit_when_idle && inner.leases.is_empty()
        };
        if exit {
            self.request_shutdown("drained: the last lease ended");
        }
    }

    /// Drop leases without a keep-alive for the lease timeout; returns how many.
    pub fn reap(&self) -> usize {
        let now = Instant::now();
        let dead: Vec<(String, Lease)> = {
            let mut inner = self.lock();
            let ids: Vec<String> = inner
                .leases
                .iter()
                .filter(|(_, l)| now.duration_since(l.last) > self.lease_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            let dead: Vec<_> = ids
                .into_iter()
                .filter_map(|id| inner.leases.remove(&id).map(|l| (id, l)))
                .collect();
            inner.reaped += dead.len() as u64;
            dead
        };
        for (id, l) in &dead {
            tracing::warn!(lease_id = %id, worker_id = %l.worker_id, pid = l.pid, "lease reaped: no keep-alive");
        }
        if !dead.is_empty() {
            self.maybe_exit_idle();
        }
        dead.len()
    }

    pub fn status(&self) -> StatusSnapshot {
        let now = Instant::now();
        let inner = self.lock();
        let mut leases: Vec<LeaseInfo> = inner
            .leases
            .iter()
            .map(|(id, l)| LeaseInfo {
                lease_id: id.clone(),
                worker_id: l.worker_id.clone(),
                pid: l.pid,
                scope: l.scope.clone(),
                age: now.duration_since(l.created),
                since_keepalive: now.duration_since(l.last),
            })
            .collect();
        leases.sort_by(|a, b| a.lease_id.cmp(&b.lease_id));
        StatusSnapshot {
            state: inner.state,
            identity: self.identity.clone(),
            leases,
            load_count: 1,
            reaped: inner.reaped,
            uptime: self.started.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(timeout_ms: u64) -> Owner {
        Owner::new(
            Identity {
                layout_identity: "sha256:L".into(),
                content_identity: "sha256:C".into(),
                backend: "host".into(),
                bytes_resident: 4096,
                generation: 1,
                regions: vec![RegionEntry { id: 0, bytes: 4096 }],
            },
            Duration::from_millis(timeout_ms),
        )
    }

    #[test]
    fn attach_keepalive_detach() {
        let o = owner(10_000);
        let (id, regions) = o.attach("w", 7, "base", "sha256:L").unwrap();
        assert_eq!(regions.len(), 1);
        assert_eq!(o.keep_alive(&id).unwrap(), OwnerState::Ready);
        assert_eq!(o.status().leases.len(), 1);
        o.detach(&id).unwrap();
        assert!(o.keep_alive(&id).is_err());
        let e = o.attach("w", 7, "base", "sha256:X").unwrap_err();
        assert!(e.to_string().contains("sha256:X") && e.to_string().contains("sha256:L"));
        assert!(o.attach("w", 7, "mtp", "").is_err());
    }

    #[test]
    fn reaps_silent_leases_and_drains() {
        let o = owner(20);
        let mut shutdown = o.shutdown_signal();
        let (_id, _) = o.attach("w", 7, "base", "").unwrap();
        assert_eq!(o.drain(true), 1);
        assert_eq!(
            o.attach("w2", 8, "base", "").unwrap_err(),
            AttachError::Draining
        );
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(o.reap(), 1);
        assert_eq!(o.status().reaped, 1);
        assert!(*shutdown.borrow_and_update());
    }
}
