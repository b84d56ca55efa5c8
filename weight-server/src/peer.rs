//! Who may talk to the owner: the socket peer's credentials (SO_PEERCRED)
//! against a policy of the owner's uid plus allowed gids.

/// A socket peer's credentials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// The owner's policy: same uid as the owner, or a primary gid in the list.
#[derive(Clone, Debug)]
pub struct PeerPolicy {
    pub uid: u32,
    pub allowed_gids: Vec<u32>,
}

impl PeerPolicy {
    /// The running process's uid and the given extra gids.
    pub fn current(allowed_gids: Vec<u32>) -> PeerPolicy {
        PeerPolicy {
            uid: nix::unistd::geteuid().as_raw(),
            allowed_gids,
        }
    }

    /// `Err` with the reason the peer is refused.
    pub fn check(&self, peer: Peer) -> Result<(), String> {
        if peer.uid == self.uid || self.allowed_gids.contains(&peer.gid) {
            return Ok(());
        }
        Err(format!(
            "peer pid {} uid {} gid {} is not allowed: the owner accepts uid {}{}; run the worker as that user or start the owner with --allow-gid {}",
            peer.pid,
            peer.uid,
            peer.gid,
            self.uid,
            if self.allowed_gids.is_empty() {
                String::new()
            } else {
                format!(" or gids {:?}", self.allowed_gids)
            },
            peer.gid
        ))
    }
}

/// Set a socket file to mode 0660 (owner and group read/write).
pub fn restrict_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_uid_or_allowed_gid_only() {
        let p = PeerPolicy {
            uid: 1000,
            allowed_gids: vec![50],
        };
        assert!(p
            .check(Peer {
                pid: 1,
                uid: 1000,
                gid: 7
            })
            .is_ok());
        assert!(p
            .check(Peer {
                pid: 1,
                uid: 2000,
                gid: 50
            })
            .is_ok());
        let e = p
            .check(Peer {
                pid: 9,
                uid: 2000,
                gid: 7,
            })
            .unwrap_err();
        assert!(
            e.contains("uid 2000") && e.contains("accepts uid 1000"),
            "{e}"
        );
        let strict = PeerPolicy {
            uid: 0,
            allowed_gids: vec![],
        };
        assert!(strict
            .check(Peer {
                pid: 1,
                uid: 65534,
                gid: 0
            })
            .is_err());
    }
}
