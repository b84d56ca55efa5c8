//! The `ds4.control.v1.WeightOwner` service: converts wire types and calls
//! [`Owner`]; its interceptor checks every call's peer (Unix socket) or
//! token (TCP, [`crate::access`]).

use std::pin::Pin;
use std::sync::Arc;

use ds4_proto::auth::Token;
use ds4_proto::client::ControlAddr;
use ds4_proto::control as pb;
use ds4_proto::control::weight_owner_server::{WeightOwner, WeightOwnerServer};
use tokio_stream::wrappers::{BroadcastStream, TcpListenerStream, UnixListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use crate::owner::{EventKind, Owner, OwnerState};
use crate::peer::{restrict_socket, Peer, PeerPolicy};

pub struct Service {
    owner: Arc<Owner>,
}

fn state(s: OwnerState) -> i32 {
    (match s {
        OwnerState::Loading => pb::OwnerState::Loading,
        OwnerState::Ready => pb::OwnerState::Ready,
        OwnerState::Draining => pb::OwnerState::Draining,
    }) as i32
}

#[tonic::async_trait]
impl WeightOwner for Service {
    async fn get_status(
        &self,
        _req: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::Status>, Status> {
        let s = self.owner.status();
        Ok(Response::new(pb::Status {
            state: state(s.state),
            generation: s.identity.generation,
            layout_identity: s.identity.layout_identity,
            content_identity: s.identity.content_identity,
            backend: s.identity.backend,
            bytes_resident: s.identity.bytes_resident,
            leases: s
                .leases
                .into_iter()
                .map(|l| pb::Lease {
                    lease_id: l.lease_id,
                    worker_id: l.worker_id,
                    pid: l.pid,
                    scope: l.scope,
                    age_s: l.age.as_secs_f64(),
                    last_keepalive_s: l.since_keepalive.as_secs_f64(),
                })
                .collect(),
            load_count: s.load_count,
            uptime_s: s.uptime.as_secs_f64(),
            reaped_leases: s.reaped,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
        }))
    }

    async fn attach(
        &self,
        req: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let r = req.into_inner();
        let (lease_id, regions) = self
            .owner
            .attach(&r.worker_id, r.pid, &r.scope, &r.expected_layout_identity)
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(Response::new(pb::AttachResponse {
            lease_id,
            regions: regions
                .into_iter()
                .map(|r| pb::Region {
                    id: r.id,
                    bytes: r.bytes,
                })
                .collect(),
            generation: self.owner.identity().generation,
            keepalive_interval_s: self.owner.lease_timeout().as_secs_f64() / 4.0,
        }))
    }

    async fn keep_alive(
        &self,
        req: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let s = self
            .owner
            .keep_alive(&req.into_inner().lease_id)
            .map_err(|e| Status::not_found(e.to_string()))?;
        Ok(Response::new(pb::KeepAliveResponse { state: state(s) }))
    }

    async fn detach(
        &self,
        req: Request<pb::DetachRequest>,
    ) -> Result<Response<pb::DetachResponse>, Status> {
        self.owner
            .detach(&req.into_inner().lease_id)
            .map_err(|e| Status::not_found(e.to_string()))?;
        Ok(Response::new(pb::DetachResponse {}))
    }

    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        let n = self.owner.drain(req.into_inner().exit_when_idle);
        Ok(Response::new(pb::DrainResponse { leases: n as u32 }))
    }

    type WatchEventsStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

    async fn watch_events(
        &self,
        _req: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let rx = self.owner.subscribe();
        let generation = self.owner.identity().generation;
        let current = match self.owner.status().state {
            OwnerState::Draining => pb::EventKind::Draining,
            _ => pb::EventKind::Ready,
        };
        let first = tokio_stream::once(Ok(pb::Event {
            kind: current as i32,
            generation,
            message: "current state".into(),
        }));
        let rest = BroadcastStream::new(rx).filter_map(|e| {
            e.ok().map(|e| {
                let kind = match e.kind {
                    EventKind::Ready => pb::EventKind::Ready,
                    EventKind::Draining => pb::EventKind::Draining,
                    EventKind::ShuttingDown => pb::EventKind::ShuttingDown,
                };
                Ok(pb::Event {
                    kind: kind as i32,
                    generation: e.generation,
                    message: e.message,
                })
            })
        });
        Ok(Response::new(Box::pin(first.chain(rest))))
    }
}

/// A bound control-plane listener (bound before the manifest is published).
pub enum Listener {
    Unix(tokio::net::UnixListener, std::path::PathBuf),
    Tcp(tokio::net::TcpListener),
}

/// Bind the control plane; a Unix socket gets mode 0660.
pub fn bind(addr: &ControlAddr) -> std::io::Result<Listener> {
    match addr {
        ControlAddr::Unix(path) => {
            remove_stale_socket(path)?;
            let l = tokio::net::UnixListener::bind(path)?;
            restrict_socket(path)?;
            Ok(Listener::Unix(l, path.clone()))
        }
        ControlAddr::Tcp(a) => {
            let std_l = std::net::TcpListener::bind(a.as_str())?;
            std_l.set_nonblocking(true)?;
            Ok(Listener::Tcp(tokio::net::TcpListener::from_std(std_l)?))
        }
    }
}

/// Remove a socket file left by a previous run (refuse to remove anything
/// that is not a socket).
pub fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        )),
        Err(_) => Ok(()),
    }
}

/// Serve until `shutdown` resolves. On a Unix socket every call is checked
/// against `policy` (SO_PEERCRED); on TCP, with a `token`, every call must
/// carry it ([`Token::check`]).
pub async fn serve(
    owner: Arc<Owner>,
    listener: Listener,
    policy: PeerPolicy,
    token: Option<Token>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let svc = WeightOwnerServer::with_interceptor(Service { owner }, move |req: Request<()>| {
        if let Some(info) = req.extensions().get::<UdsConnectInfo>() {
            let Some(cred) = info.peer_cred else {
                return Err(Status::permission_denied("peer credentials unavailable"));
            };
            let peer = Peer {
                pid: cred.pid().unwrap_or(0),
                uid: cred.uid(),
                gid: cred.gid(),
            };
            if let Err(why) = policy.check(peer) {
                tracing::warn!(
                    peer_uid = peer.uid,
                    peer_gid = peer.gid,
                    peer_pid = peer.pid,
                    "control plane: {why}"
                );
                return Err(Status::permission_denied(why));
            }
        } else if let Some(token) = &token {
            if let Err(status) = token.check(req.metadata()) {
                tracing::warn!(
                    peer = %req.remote_addr().map_or_else(|| "unknown".into(), |a| a.to_string()),
                    "control plane: call refused: {}",
                    status.message()
                );
                return Err(status);
            }
        }
        Ok(req)
    });
    let router = tonic::transport::Server::builder().add_service(svc);
    match listener {
        Listener::Unix(l, _) => {
            router
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), shutdown)
                .await
        }
        Listener::Tcp(l) => {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), shutdown)
                .await
        }
    }
}
