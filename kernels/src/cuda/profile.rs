//! Per-kernel GPU time, for finding where a forward pass spends it.
//!
//! With `DS4_CUDA_PROFILE=1` in the environment (or between
//! [`crate::Backend::profile`] calls), recorded commands are issued one
//! by one between timing events (no graphs), and the table of device time
//! per kernel and grid comes back (or is printed when the backend is
//! dropped). Timing serializes the stream: use it to rank kernels, not to
//! measure speed.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::dev_err;
use super::queue::Cmd;
use crate::backend::BackendError;

/// What the profile adds up by: a kernel's name (or a command's kind)
/// and its grid.
type Key = (&'static str, (u32, u32, u32));

#[derive(Default)]
pub struct Profile {
    /// Kernel names by function handle.
    pub names: HashMap<usize, &'static str>,
    /// (calls, milliseconds) per kernel name or command kind and grid
    /// (kernels of one name over different shapes are told apart).
    totals: HashMap<Key, (u64, f64)>,
}

impl Profile {
    /// Issues `cmds` with an event after each; adds their device times.
    pub fn issue(&mut self, stream: &Arc<CudaStream>, cmds: &[Cmd]) -> Result<(), BackendError> {
        let ctx = stream.context();
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| dev_err("creating a timing event", e))
        };
        let record = |e: &CudaEvent| {
            e.record(stream)
                .map_err(|e| dev_err("recording an event", e))
        };
        let mut marks = vec![event()?];
        record(&marks[0])?;
        for c in cmds {
            super::queue::issue(stream, std::slice::from_ref(c), Default::default())?;
            let e = event()?;
            record(&e)?;
            marks.push(e);
        }
        let last = marks.last().expect("an event");
        last.synchronize()
            .map_err(|e| dev_err("waiting for an event", e))?;
        for (c, w) in cmds.iter().zip(marks.windows(2)) {
            let ms = w[0]
                .elapsed_ms(&w[1])
                .map_err(|e| dev_err("reading an event", e))? as f64;
            let key = match c {
                Cmd::Launch { func, grid, .. } => {
                    (self.names.get(func).copied().unwrap_or("?"), *grid)
                }
                Cmd::Memset { .. } => ("(memset)", (0, 0, 0)),
                Cmd::HtoD { .. } => ("(host to device)", (0, 0, 0)),
                Cmd::DtoD { .. } => ("(device copy)", (0, 0, 0)),
                Cmd::Fork | Cmd::Back | Cmd::Join => ("(stream order)", (0, 0, 0)),
            };
            let t = self.totals.entry(key).or_default();
            t.0 += 1;
            t.1 += ms;
        }
        Ok(())
    }

    /// A profile with the same kernel names and nothing timed yet.
    pub fn fresh(&self) -> Profile {
        Profile {
            names: self.names.clone(),
            totals: HashMap::new(),
        }
    }

    /// The table, most time first: per kernel and grid, its calls, total
    /// and mean time and share; the last line the sum.
    pub fn report(&self) -> String {
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        let calls: u64 = rows.iter().map(|r| r.1 .0).sum();
        let mut s = format!(
            "{:<24} {:>18} {:>9} {:>12} {:>10} {:>6}\n",
            "kernel", "grid", "calls", "total ms", "avg us", "share"
        );
        for ((name, (gx, gy, gz)), (n, ms)) in rows {
            s += &format!(
                "{:<24} {:>18} {:>9} {:>12.3} {:>10.2} {:>5.1}%\n",
                name,
                format!("{gx}x{gy}x{gz}"),
                n,
                ms,
                1000.0 * ms / *n as f64,
                100.0 * ms / total.max(1e-9)
            );
        }
        s += &format!("{:<24} {:>18} {calls:>9} {total:>12.3}\n", "(all)", "");
        s
    }
}
