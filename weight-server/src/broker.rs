//! The fd broker: a Unix stream socket beside the manifest that hands a
//! lease holder its regions' file descriptors by SCM_RIGHTS (protocol in
//! `ds4_proto::broker`). Every connection's peer is checked with
//! SO_PEERCRED first; a stranger gets a refusal line, never an fd.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ds4_proto::broker::{FdReply, FdRequest, MAX_FDS_PER_MESSAGE};
use nix::sys::socket::{getsockopt, sendmsg, sockopt, ControlMessage, MsgFlags, UnixAddr};

use crate::owner::Owner;
use crate::peer::{restrict_socket, Peer, PeerPolicy};

/// What the broker serves: region ids and a descriptor for each.
pub struct Regions {
    pub ids: Vec<u32>,
    pub fds: Vec<OwnedFd>,
}

/// Bind the broker socket (mode 0660) and serve it on a thread.
pub fn start(
    path: &Path,
    owner: Arc<Owner>,
    regions: Regions,
    policy: PeerPolicy,
) -> std::io::Result<PathBuf> {
    crate::grpc::remove_stale_socket(path)?;
    let listener = UnixListener::bind(path)?;
    restrict_socket(path)?;
    let regions = Arc::new(regions);
    std::thread::Builder::new()
        .name("fd-broker".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(stream) = conn else { continue };
                let (owner, regions, policy) = (owner.clone(), regions.clone(), policy.clone());
                let _ = std::thread::Builder::new()
                    .name("fd-broker-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(stream, &owner, &regions, &policy) {
                            tracing::warn!(error = %e, "fd broker connection failed");
                        }
                    });
            }
        })?;
    Ok(path.to_path_buf())
}

fn reply(mut stream: &UnixStream, r: &FdReply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("reply serializes");
    line.push(b'\n');
    stream.write_all(&line)
}

fn refuse(stream: &UnixStream, why: String) -> std::io::Result<()> {
    reply(
        stream,
        &FdReply {
            error: Some(why),
            regions: vec![],
            batches: 0,
        },
    )
}

fn handle(
    stream: UnixStream,
    owner: &Owner,
    regions: &Regions,
    policy: &PeerPolicy,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let cred = getsockopt(&stream, sockopt::PeerCredentials)?;
    let peer = Peer {
        pid: cred.pid(),
        uid: cred.uid(),
        gid: cred.gid(),
    };
    if let Err(why) = policy.check(peer) {
        tracing::warn!(
            peer_uid = peer.uid,
            peer_gid = peer.gid,
            peer_pid = peer.pid,
            "fd broker: {why}"
        );
        return refuse(&stream, why);
    }
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let req: FdRequest = match serde_json::from_str(&line) {
        Ok(r) => r,
        Err(e) => return refuse(&stream, format!("bad request: {e}")),
    };
    if let Err(e) = owner.lease_scope(&req.lease_id) {
        return refuse(&stream, e.to_string());
    }
    let batches = regions.fds.chunks(MAX_FDS_PER_MESSAGE).count();
    reply(
        &stream,
        &FdReply {
            error: None,
            regions: regions.ids.clone(),
            batches: batches as u32,
        },
    )?;
    for batch in regions.fds.chunks(MAX_FDS_PER_MESSAGE) {
        let mut go = [0u8; 1];
        reader.read_exact(&mut go)?;
        let raw: Vec<RawFd> = batch.iter().map(|f| f.as_raw_fd()).collect();
        sendmsg::<UnixAddr>(
            stream.as_raw_fd(),
            &[std::io::IoSlice::new(b"F")],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::empty(),
            None,
        )?;
    }
    tracing::info!(lease_id = %req.lease_id, peer_pid = peer.pid, fds = regions.fds.len(), "fds sent");
    Ok(())
}
