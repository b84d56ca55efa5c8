//! Per-kernel GPU time, for finding where a forward pass spends it.
//!
//! With `DS4_CUDA_PROFILE=1` in the environment, recorded commands are
//! issued one by one between timing events (no graphs), and the backend
//! prints a table of device time per kernel when it is dropped. Timing
//! serializes the stream: use it to rank kernels, not to measure speed.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent, CudaStream};

use super::dev_err;
use super::queue::Cmd;
use crate::backend::BackendError;

#[derive(Default)]
pub struct Profile {
    /// Kernel names by function handle.
    pub names: HashMap<usize, &'static str>,
    /// (calls, milliseconds) per kernel name or command kind.
    totals: HashMap<&'static str, (u64, f64)>,
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
            super::queue::issue(stream, std::slice::from_ref(c), false)?;
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
            let name = match c {
                Cmd::Launch { func, .. } => self.names.get(func).copied().unwrap_or("?"),
                Cmd::Memset { .. } => "(memset)",
                Cmd::HtoD { .. } => "(host to device)",
                Cmd::DtoD { .. } => "(device copy)",
            };
            let t = self.totals.entry(name).or_default();
            t.0 += 1;
            t.1 += ms;
        }
        Ok(())
    }

    /// The table, most time first.
    pub fn report(&self) -> String {
        let mut rows: Vec<_> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = rows.iter().map(|r| r.1 .1).sum();
        let mut s = format!(
            "{:<24} {:>9} {:>12} {:>10} {:>6}\n",
            "kernel", "calls", "total ms", "avg us", "share"
        );
        for (name, (n, ms)) in rows {
            s += &format!(
                "{:<24} {:>9} {:>12.3} {:>10.2} {:>5.1}%\n",
                name,
                n,
                ms,
                1000.0 * ms / *n as f64,
                100.0 * ms / total.max(1e-9)
            );
        }
        s
    }
}
