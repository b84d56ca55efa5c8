//! Load progress: a bar on a terminal; otherwise a log line (bytes, rate,
//! ETA) every few seconds, mirrored to systemd as `STATUS=`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::notify::Notifier;

const LOG_EVERY: Duration = Duration::from_secs(2);
const GIB: f64 = (1u64 << 30) as f64;

pub struct Progress<'a> {
    total: u64,
    done: u64,
    start: Instant,
    last: Instant,
    tty: bool,
    notifier: &'a Notifier,
}

impl<'a> Progress<'a> {
    pub fn new(total: u64, notifier: &'a Notifier) -> Progress<'a> {
        let now = Instant::now();
        Progress {
            total,
            done: 0,
            start: now,
            last: now,
            tty: std::io::stderr().is_terminal(),
            notifier,
        }
    }

    pub fn add(&mut self, bytes: u64) {
        self.done += bytes;
        let now = Instant::now();
        let every = if self.tty {
            Duration::from_millis(100)
        } else {
            LOG_EVERY
        };
        if now.duration_since(self.last) >= every {
            self.last = now;
            self.report(false);
        }
    }

    fn line(&self) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(1e-6);
        let rate = self.done as f64 / secs;
        let eta = if rate > 0.0 {
            (self.total.saturating_sub(self.done)) as f64 / rate
        } else {
            0.0
        };
        format!(
            "loading {:.2}/{:.2} GiB ({:.0}%), {:.2} GiB/s, ETA {:.0} s",
            self.done as f64 / GIB,
            self.total as f64 / GIB,
            100.0 * self.done as f64 / self.total.max(1) as f64,
            rate / GIB,
            eta
        )
    }

    fn report(&self, last: bool) {
        let line = self.line();
        self.notifier.status(&line);
        if self.tty {
            let width = 30usize;
            let filled = (width as u64 * self.done / self.total.max(1)) as usize;
            let mut err = std::io::stderr();
            let _ = write!(
                err,
                "\r[{}{}] {line}{}",
                "#".repeat(filled),
                "-".repeat(width - filled.min(width)),
                if last { "\n" } else { "" }
            );
            let _ = err.flush();
        } else {
            tracing::info!(bytes = self.done, total = self.total, "{line}");
        }
    }

    /// Print the final state.
    pub fn finish(&self) {
        self.report(true);
    }
}
