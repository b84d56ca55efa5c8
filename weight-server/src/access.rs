//! Who may reach the control plane over TCP. The default Unix socket is
//! guarded by its mode (0660) and every peer's SO_PEERCRED credentials
//! ([`crate::peer`]); TCP has neither, and the control plane can drain and
//! stop the owner. So a TCP address must be loopback unless
//! `--grpc-allow-remote` is given, a remote one needs the shared secret of
//! `--grpc-token-file` ([`ds4_proto::auth`]), and with a token every TCP
//! call must carry it. Checked at start, before any model is read.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::Path;

use ds4_proto::auth::{Token, TokenError, MAKE_TOKEN};
use ds4_proto::client::ControlAddr;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("--grpc {addr}: {problem}; expected HOST:PORT (e.g. 127.0.0.1:7070) or unix:PATH")]
    BadAddress { addr: String, problem: String },
    #[error("--grpc {addr} is not a loopback address ({found}), and whoever reaches the control plane can drain and stop this owner: use 127.0.0.1:PORT or a unix: socket, or pass --grpc-allow-remote with --grpc-token-file to accept remote clients that hold the token")]
    NotLoopback { addr: String, found: IpAddr },
    #[error("--grpc-allow-remote needs --grpc-token-file: remote clients must present a shared secret; {MAKE_TOKEN}")]
    RemoteWithoutToken,
    #[error("--grpc-allow-remote and --grpc-token-file are for a TCP control plane (--grpc HOST:PORT); {addr} is a Unix socket, whose peers are checked by their credentials (see --allow-gid)")]
    NotTcp { addr: String },
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// Check the control-plane address against the flags; returns the token
/// every TCP call must carry, if any.
pub fn control_access(
    addr: &ControlAddr,
    allow_remote: bool,
    token_file: Option<&Path>,
) -> Result<Option<Token>, AccessError> {
    let ControlAddr::Tcp(a) = addr else {
        if allow_remote || token_file.is_some() {
            return Err(AccessError::NotTcp {
                addr: addr.to_string(),
            });
        }
        return Ok(None);
    };
    let token = token_file.map(Token::read_file).transpose()?;
    let resolved: Vec<IpAddr> = a
        .to_socket_addrs()
        .map_err(|e| AccessError::BadAddress {
            addr: a.clone(),
            problem: e.to_string(),
        })?
        .map(|s| s.ip())
        .collect();
    if resolved.is_empty() {
        return Err(AccessError::BadAddress {
            addr: a.clone(),
            problem: "resolves to no address".into(),
        });
    }
    if allow_remote {
        if token.is_none() {
            return Err(AccessError::RemoteWithoutToken);
        }
        return Ok(token);
    }
    if let Some(&found) = resolved.iter().find(|ip| !ip.is_loopback()) {
        return Err(AccessError::NotLoopback {
            addr: a.clone(),
            found,
        });
    }
    if token.is_none() {
        tracing::warn!(
            grpc = %a,
            "control plane on loopback TCP without --grpc-token-file: every local user can drain or stop this owner; prefer the default unix: socket, or set a token"
        );
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tcp(s: &str) -> ControlAddr {
        ControlAddr::parse(s)
    }

    #[test]
    fn loopback_only_unless_allowed_and_then_with_a_token() {
        assert!(control_access(&tcp("127.0.0.1:7070"), false, None)
            .unwrap()
            .is_none());
        assert!(control_access(&tcp("[::1]:7070"), false, None).is_ok());
        for remote in ["0.0.0.0:7070", "10.1.2.3:7070", "[::]:7070"] {
            let e = control_access(&tcp(remote), false, None).unwrap_err();
            assert!(
                matches!(e, AccessError::NotLoopback { .. }),
                "{remote}: {e}"
            );
            assert!(e.to_string().contains("--grpc-allow-remote"), "{e}");
        }
        let e = control_access(&tcp("0.0.0.0:7070"), true, None).unwrap_err();
        assert!(matches!(e, AccessError::RemoteWithoutToken), "{e}");
        let e = control_access(&tcp("no-port"), false, None).unwrap_err();
        assert!(matches!(e, AccessError::BadAddress { .. }), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = control_access(&tcp("0.0.0.0:7070"), true, Some(&file)).unwrap();
        assert!(t.is_some());
        let e = control_access(&tcp("unix:/run/x.sock"), true, Some(&file)).unwrap_err();
        assert!(matches!(e, AccessError::NotTcp { .. }), "{e}");
        assert!(control_access(&tcp("unix:/run/x.sock"), false, None)
            .unwrap()
            .is_none());
    }
}
