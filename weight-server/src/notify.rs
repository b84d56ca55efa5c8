//! The systemd notify protocol (`sd_notify(3)`): datagrams of
//! `KEY=VALUE` lines to the socket named by `NOTIFY_SOCKET`. A no-op when
//! the variable is unset (not started by systemd).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug)]
enum Target {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// A handle to the service manager's notify socket.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From `NOTIFY_SOCKET` and `WATCHDOG_USEC`.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").map(|s| {
            let bytes = std::os::unix::ffi::OsStrExt::as_bytes(s.as_os_str()).to_vec();
            match bytes.strip_prefix(b"@") {
                Some(name) => Target::Abstract(name.to_vec()),
                None => Target::Path(PathBuf::from(s)),
            }
        });
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .filter(|&us| us > 0)
            .map(Duration::from_micros);
        Notifier { target, watchdog }
    }

    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// How often to send `WATCHDOG=1` (half the manager's timeout).
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|d| d / 2)
    }

    /// Send one message; errors are logged, never fatal.
    pub fn send(&self, msg: &str) {
        let Some(target) = &self.target else { return };
        let sent = UnixDatagram::unbound().and_then(|sock| match target {
            Target::Path(p) => sock.send_to(msg.as_bytes(), p),
            Target::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(msg.as_bytes(), &addr)
            }
        });
        if let Err(e) = sent {
            tracing::warn!(error = %e, "systemd notify failed");
        }
    }

    pub fn status(&self, text: &str) {
        self.send(&format!("STATUS={}", text.replace('\n', " ")));
    }

    pub fn ready(&self, text: &str) {
        self.send(&format!(
            "READY=1\nSTATUS={}\nMAINPID={}",
            text.replace('\n', " "),
            std::process::id()
        ));
    }

    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=shutting down");
    }

    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_to_a_fake_notify_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = Notifier {
            target: Some(Target::Path(path)),
            watchdog: Some(Duration::from_secs(10)),
        };
        assert_eq!(n.watchdog_interval(), Some(Duration::from_secs(5)));
        n.status("loading 10%");
        n.ready("ready");
        n.watchdog();
        let mut buf = [0u8; 256];
        let mut recv = || {
            let k = server.recv(&mut buf).unwrap();
            String::from_utf8(buf[..k].to_vec()).unwrap()
        };
        assert_eq!(recv(), "STATUS=loading 10%");
        let ready = recv();
        assert!(
            ready.starts_with("READY=1\nSTATUS=ready\nMAINPID="),
            "{ready}"
        );
        assert_eq!(recv(), "WATCHDOG=1");
    }

    #[test]
    fn silent_without_socket() {
        let n = Notifier {
            target: None,
            watchdog: None,
        };
        assert!(!n.enabled());
        n.ready("x");
    }
}
