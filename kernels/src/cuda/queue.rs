//! Deferred execution and CUDA graphs.
//!
//! Ops do not launch: they record commands (kernel launches with their
//! argument values, memsets, copies) into a list. The list is issued when
//! the host needs a result ([`Backend::to_host`](crate::Backend::to_host),
//! argmax, KV block copies) or an allocation must fold. Because every
//! address comes from the deterministic [`super::arena`], a decode step
//! records exactly the same list as the step before it (token ids,
//! positions and block tables are data in pinned staging, not arguments):
//! the first time a list is seen it is issued as is, the second time it is
//! captured into a CUDA graph, and from then on the graph is replayed with
//! one launch. A new batch shape (rows, sequences, context bucket) is a
//! new list and gets its own graph; the least recently used graphs are
//! dropped past [`MAX_GRAPHS`]. A long pass is issued in chunks (at the
//! norm that starts a stage, once enough commands are pending), so the
//! device runs one chunk while the host records the next; each chunk is a
//! list, and a graph, of its own.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaGraph, CudaStream};

use super::arena::{ReadBack, Region, Staging};
use super::dev_err;
use crate::backend::{BackendError, Branch};

/// Most kernel arguments of any kernel in `kernels/cuda`.
pub const MAX_ARGS: usize = 26;
/// Graphs kept (a few per batch shape seen twice: passes are issued in
/// chunks, see `CudaBackend::issue_chunk`).
const MAX_GRAPHS: usize = 512;
/// Lists shorter than this are issued directly (a graph would not pay).
const MIN_GRAPH_CMDS: usize = 8;

/// A kernel argument: each takes one 8-byte slot; 4-byte arguments are
/// read from the slot's low half (little-endian).
pub trait KernelArg {
    fn slot(&self) -> u64;
}

impl KernelArg for u64 {
    fn slot(&self) -> u64 {
        *self
    }
}

impl KernelArg for i32 {
    fn slot(&self) -> u64 {
        *self as u32 as u64
    }
}

impl KernelArg for u32 {
    fn slot(&self) -> u64 {
        *self as u64
    }
}

impl KernelArg for f32 {
    fn slot(&self) -> u64 {
        self.to_bits() as u64
    }
}

/// Bytes one `zero_bytes` block clears per pass (256 threads, 16 each).
const ZERO_BLOCK_BYTES: u64 = 4096;

/// One recorded command. Equal lists issue identical work. (Most are
/// launches, so boxing their arguments would only add an allocation.)
#[allow(clippy::large_enum_variant)]
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Cmd {
    Launch {
        /// The `CUfunction` handle.
        func: usize,
        grid: (u32, u32, u32),
        block: u32,
        /// Dynamic shared memory in bytes.
        smem: u32,
        n_args: u8,
        args: [u64; MAX_ARGS],
    },
    /// Zero `bytes` at `dst`.
    Memset {
        dst: u64,
        bytes: usize,
    },
    /// Copy `bytes` from pinned host address `src` to `dst`.
    HtoD {
        dst: u64,
        src: usize,
        bytes: usize,
    },
    DtoD {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    /// The commands after this one run on the side stream, after what
    /// the main stream has so far (a second branch of the graph), and,
    /// where a fork is still open, after the side stream's commands.
    Fork,
    /// The commands after this one run on the main stream again, beside
    /// the side stream's.
    Back,
    /// The main stream waits for what the side stream has so far. A list
    /// ends with one where a fork is still open.
    Join,
}

/// The second stream of a [`Cmd::Fork`] and the two events that order it
/// against the main stream (raw handles: cudarc's own streams would put
/// its context in multi-stream mode, with events on every allocation).
pub struct Side {
    /// Kept so that the context outlives the handles made in it.
    ctx: Arc<cudarc::driver::CudaContext>,
    stream: sys::CUstream,
    fork: sys::CUevent,
    join: sys::CUevent,
}

// SAFETY: the handles are used only under the backend's lock.
unsafe impl Send for Side {}

impl Side {
    /// A non-blocking stream and two events without timing, in `ctx`.
    pub fn new(ctx: &Arc<cudarc::driver::CudaContext>) -> Result<Side, BackendError> {
        ctx.bind_to_thread()
            .map_err(|e| dev_err("binding the CUDA context", e))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| dev_err("creating the side stream", e))?;
        let event = || {
            result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(|e| dev_err("creating a side-stream event", e))
        };
        Ok(Side {
            ctx: ctx.clone(),
            stream,
            fork: event()?,
            join: event()?,
        })
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        // SAFETY: created in `new` in this context (alive: held), destroyed
        // once; pending work on the stream completes before its resources
        // are released.
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        unsafe {
            let _ = result::event::destroy(self.fork);
            let _ = result::event::destroy(self.join);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

struct Graph {
    /// The list this graph issues (compared in full on a hash match).
    cmds: Vec<Cmd>,
    graph: Option<CudaGraph>,
    seen: u32,
    last_use: u64,
}

// SAFETY: graphs are created, launched and dropped only under the
// backend's lock (cudarc's note: graph objects need external
// serialization, not a particular thread).
unsafe impl Send for Graph {}

/// Graph use since the backend was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Command lists issued without a graph.
    pub direct: u64,
    /// Graphs captured and instantiated.
    pub captured: u64,
    /// Launches of an existing graph.
    pub replayed: u64,
}

/// Where the host's time went since the backend was created: recording
/// commands (the ops' Rust code, from the first command of a list to its
/// flush), issuing them, and waiting for the device.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HostTiming {
    pub lists: u64,
    pub commands: u64,
    pub recording_s: f64,
    pub issuing_s: f64,
    pub waiting_s: f64,
}

impl std::fmt::Display for HostTiming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per = |s: f64| 1e6 * s / self.lists.max(1) as f64;
        write!(
            f,
            "{} command lists ({:.1} commands each): recording {:.1} us, issuing {:.1} us, \
             waiting for the device {:.1} us per list",
            self.lists,
            self.commands as f64 / self.lists.max(1) as f64,
            per(self.recording_s),
            per(self.issuing_s),
            per(self.waiting_s)
        )
    }
}

/// Everything behind the backend's lock.
pub struct State {
    cmds: Vec<Cmd>,
    /// Hash of `cmds`, kept up to date as they are recorded.
    hash: u64,
    /// `hash` before each command of `cmds` was recorded (see
    /// [`State::edit`]).
    hash_before: Vec<u64>,
    /// Tensors and uploads; reset when no tensor is alive.
    pub tensors: Region,
    /// Scratch of one op; reset at the start of every op.
    pub scratch: Region,
    /// Per-op scratch of the ops of a side branch.
    pub side_scratch: Region,
    pub staging: Staging,
    /// Where read-backs land before they are copied out.
    pub readback: ReadBack,
    /// Uploads of this pass by content (every layer uploads the same
    /// positions and block tables).
    pub uploads: HashMap<Vec<u8>, u64>,
    /// Graphs by the hash of their command list.
    graphs: HashMap<u64, Vec<Graph>>,
    n_graphs: usize,
    pub graphs_on: bool,
    /// Kernels launch with programmatic stream serialization (sm_90+; see
    /// `pdl_wait` in common.cuh): each may start while the one before it
    /// finishes.
    pub pdl: bool,
    /// With `pdl`: the `zero_bytes` kernel's handle, which then zeroes in
    /// place of memsets (a run of adjacent ones in one launch), so that
    /// fresh tensors do not break the chain of early launches; 0: memsets.
    pub zero_func: usize,
    /// The side stream of [`Cmd::Fork`]; None: forks run on the main
    /// stream, in order.
    pub side: Option<Side>,
    /// A [`Cmd::Fork`] recorded and not joined yet.
    pub fork_open: bool,
    /// Recording a forward pass's side branch ([`Branch::Beside`] up to
    /// [`Branch::Main`]): its ops take their scratch from `side_scratch`,
    /// as they may run while the main line's ops reuse `scratch`.
    pub in_side: bool,
    /// A side branch recorded and not joined yet: chunks are not issued
    /// (the end of a list joins the side stream).
    pub branch_open: bool,
    tick: u64,
    pub stats: GraphStats,
    pub timing: HostTiming,
    /// When the first command of the pending list was recorded.
    recording_since: Option<std::time::Instant>,
    /// Activation quantizations fused into the kernel that produced the
    /// activation (see `CudaBackend::fuse_quantization`).
    pub fused_quantizations: u64,
    /// KV stores fused with the RoPE launch before them.
    pub fused_rope_stores: u64,
    /// Fresh-tensor zeroings dropped (see [`State::drop_fresh_memset`]).
    pub dropped_memsets: u64,
    /// Residual adds done inside the hc_post after them, and hc_norm
    /// launches replaced by the hc_post before (see hyper.rs).
    pub fused_hc_adds: u64,
    pub fused_hc_norms: u64,
    /// Side branches recorded ([`Branch::Beside`]).
    pub side_branches: u64,
    /// Set when kernels are timed one by one (see [`super::profile`]).
    pub profile: Option<super::profile::Profile>,
    /// The kernel names a profile reports under (filled when the modules
    /// are loaded), so that one can start at any time.
    pub profile_names: super::profile::Profile,
    /// Buffers dropped while recorded commands may still use them: freed
    /// once those commands are issued (see [`Deferred`]).
    graveyard: Vec<Box<dyn std::any::Any + Send>>,
}

impl State {
    pub fn new(graphs_on: bool) -> State {
        State {
            cmds: Vec::new(),
            hash: 0,
            hash_before: Vec::new(),
            tensors: Region::new("tensor arena", 16 << 20),
            scratch: Region::new("op scratch", 4 << 20),
            side_scratch: Region::new("side-branch op scratch", 4 << 20),
            staging: Staging::default(),
            readback: ReadBack::default(),
            uploads: HashMap::new(),
            graphs: HashMap::new(),
            n_graphs: 0,
            graphs_on,
            pdl: false,
            zero_func: 0,
            side: None,
            fork_open: false,
            in_side: false,
            branch_open: false,
            tick: 0,
            stats: GraphStats::default(),
            timing: HostTiming::default(),
            recording_since: None,
            fused_quantizations: 0,
            fused_rope_stores: 0,
            dropped_memsets: 0,
            fused_hc_adds: 0,
            side_branches: 0,
            fused_hc_norms: 0,
            profile: None,
            profile_names: Default::default(),
            graveyard: Vec::new(),
        }
    }

    pub fn launch(
        &mut self,
        func: sys::CUfunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[u64],
    ) {
        assert!(
            args.len() <= MAX_ARGS,
            "kernel with {} arguments",
            args.len()
        );
        let mut a = [0u64; MAX_ARGS];
        a[..args.len()].copy_from_slice(args);
        self.push(Cmd::Launch {
            func: func as usize,
            grid,
            block,
            smem,
            n_args: args.len() as u8,
            args: a,
        });
    }

    /// Commands recorded and not issued yet.
    pub fn pending(&self) -> usize {
        self.cmds.len()
    }

    /// The last recorded launch, looking past the trailing commands that
    /// `skip` accepts (writes to fresh buffers, which the launch does not
    /// touch): how many places before the last it is (0: the last), and
    /// the launch. None when the first command not skipped is no launch.
    pub fn last_launch(&self, skip: impl Fn(&Cmd) -> bool) -> Option<(usize, &Cmd)> {
        let back = self.cmds.iter().rev().take_while(|c| skip(c)).count();
        self.cmds
            .iter()
            .rev()
            .nth(back)
            .filter(|c| matches!(c, Cmd::Launch { .. }))
            .map(|c| (back, c))
    }

    /// Rewrites the pending command `back` places before the last (0: the
    /// last): `edit` gets it and returns what takes its place (None:
    /// nothing). The commands after it stay, in order (the peephole
    /// fusions of `CudaBackend` use this).
    pub fn edit(&mut self, back: usize, edit: impl FnOnce(Cmd) -> Option<Cmd>) {
        let after: Vec<Cmd> = (0..back).filter_map(|_| self.pop_last()).collect();
        let c = self.pop_last().expect("a pending command that far back");
        if let Some(c) = edit(c) {
            self.push(c);
        }
        for c in after.into_iter().rev() {
            self.push(c);
        }
    }

    /// Takes back the pending zeroing of exactly `dst .. dst + bytes` (a
    /// fresh tensor's) when no command recorded after it names an address
    /// in that range: the op about to be recorded writes all of it, so
    /// the zeros would never be read. Looks at most 64 commands back;
    /// returns whether it dropped one.
    pub fn drop_fresh_memset(&mut self, dst: u64, bytes: usize) -> bool {
        let end = dst + bytes as u64;
        let inside = |p: u64| p >= dst && p < end;
        let overlaps = |p: u64, n: usize| p < end && p + n as u64 > dst;
        let mut found = None;
        for (back, c) in self.cmds.iter().rev().enumerate().take(64) {
            let touches = match *c {
                Cmd::Memset { dst: d, bytes: b } if d == dst && b == bytes => {
                    found = Some(back);
                    break;
                }
                Cmd::Memset { dst: d, bytes: b } => overlaps(d, b),
                Cmd::Launch {
                    n_args, ref args, ..
                } => args[..n_args as usize].iter().any(|&a| inside(a)),
                Cmd::HtoD {
                    dst: d, bytes: b, ..
                } => overlaps(d, b),
                Cmd::DtoD {
                    dst: d,
                    src,
                    bytes: b,
                } => overlaps(d, b) || overlaps(src, b),
                Cmd::Fork | Cmd::Back | Cmd::Join => false,
            };
            if touches {
                return false;
            }
        }
        let Some(back) = found else {
            return false;
        };
        self.edit(back, |_| None);
        true
    }

    /// Takes back the last recorded command.
    fn pop_last(&mut self) -> Option<Cmd> {
        let c = self.cmds.pop()?;
        self.hash = self.hash_before.pop().expect("one hash per command");
        Some(c)
    }

    /// Records a command.
    pub fn push(&mut self, c: Cmd) {
        if self.cmds.is_empty() && self.recording_since.is_none() {
            self.recording_since = Some(std::time::Instant::now());
        }
        self.hash_before.push(self.hash);
        let mut h = Fx(self.hash);
        match &c {
            Cmd::Launch {
                func,
                grid,
                block,
                smem,
                n_args,
                args,
            } => {
                h.add(1);
                h.add(*func as u64);
                h.add(grid.0 as u64 | (grid.1 as u64) << 32);
                h.add(grid.2 as u64 | (*block as u64) << 32);
                h.add(*smem as u64);
                for &a in &args[..*n_args as usize] {
                    h.add(a);
                }
            }
            Cmd::Memset { dst, bytes } => {
                h.add(2);
                h.add(*dst);
                h.add(*bytes as u64);
            }
            Cmd::HtoD { dst, src, bytes } => {
                h.add(3);
                h.add(*dst);
                h.add(*src as u64);
                h.add(*bytes as u64);
            }
            Cmd::DtoD { dst, src, bytes } => {
                h.add(4);
                h.add(*dst);
                h.add(*src);
                h.add(*bytes as u64);
            }
            Cmd::Fork => h.add(5),
            Cmd::Back => h.add(6),
            Cmd::Join => h.add(7),
        }
        self.hash = h.0;
        self.cmds.push(c);
    }

    /// Records a copy of `data` to new tensor-region memory; returns it.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, data: &[u8]) -> Result<u64, BackendError> {
        let dst = self.tensors.alloc(stream, data.len())?;
        if !data.is_empty() {
            let src = self.staging.put(stream.context(), data)?;
            self.push(Cmd::HtoD {
                dst,
                src,
                bytes: data.len(),
            });
        }
        Ok(dst)
    }

    /// Resets the tensor region (no tensor is alive).
    pub fn reset_tensors(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if self.tensors.needs_fold() {
            self.flush(stream)?;
        }
        self.uploads.clear();
        self.tensors.reset(stream)
    }

    /// The scratch region of the op being recorded: a side branch's own
    /// while one is recorded.
    pub fn scratch_region(&mut self) -> &mut Region {
        if self.in_side {
            &mut self.side_scratch
        } else {
            &mut self.scratch
        }
    }

    /// Resets the scratch region (a new op starts).
    pub fn reset_scratch(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if self.scratch_region().needs_fold() {
            self.flush(stream)?;
        }
        self.scratch_region().reset(stream)
    }

    /// Records a forward pass's branch mark (see [`Branch`]): a side
    /// branch is a [`Cmd::Fork`] .. [`Cmd::Back`] run, joined at
    /// [`Branch::Join`] (or by the next join: the hyper-connection
    /// pre's, or the end of the list). Marks out of place are ignored.
    pub fn branch(&mut self, at: Branch) {
        match at {
            Branch::Beside if !self.in_side => {
                self.push(Cmd::Fork);
                self.in_side = true;
                self.side_branches += 1;
            }
            Branch::Main if self.in_side => {
                self.push(Cmd::Back);
                self.in_side = false;
                self.fork_open = true;
                self.branch_open = true;
            }
            Branch::Join => {
                self.branch(Branch::Main);
                self.join();
            }
            _ => {}
        }
    }

    /// Records the join of the side stream where a fork is open (before an
    /// op that reads what the side computed).
    pub fn join(&mut self) {
        if self.fork_open {
            self.push(Cmd::Join);
            self.fork_open = false;
        }
        self.branch_open = false;
    }

    /// Waits for the stream (everything issued) and counts the wait.
    pub fn wait(&mut self, stream: &CudaStream) -> Result<(), BackendError> {
        let start = std::time::Instant::now();
        stream
            .synchronize()
            .map_err(|e| dev_err("synchronize", e))?;
        self.timing.waiting_s += start.elapsed().as_secs_f64();
        self.synced();
        Ok(())
    }

    /// The stream has executed everything issued: staging can be reused.
    pub fn synced(&mut self) {
        if self.cmds.is_empty() {
            self.staging.reset();
        }
    }

    /// Issues the recorded commands: through a graph when this list was
    /// seen before, else directly.
    pub fn flush(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if self.cmds.is_empty() {
            return Ok(());
        }
        let start = std::time::Instant::now();
        if let Some(t) = self.recording_since.take() {
            self.timing.recording_s += (start - t).as_secs_f64();
        }
        self.timing.lists += 1;
        self.timing.commands += self.cmds.len() as u64;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| dev_err("binding the CUDA context", e))?;
        let r = self.issue_pending(stream);
        self.timing.issuing_s += start.elapsed().as_secs_f64();
        self.cmds.clear();
        self.hash_before.clear();
        self.hash = 0;
        // issue joined a fork still open at the end of the list.
        self.fork_open = false;
        self.branch_open = false;
        // Frees are stream-ordered: after the commands just issued.
        self.graveyard.clear();
        r
    }

    fn issue_pending(&mut self, stream: &Arc<CudaStream>) -> Result<(), BackendError> {
        if let Some(p) = &mut self.profile {
            self.stats.direct += 1;
            return p.issue(stream, &self.cmds);
        }
        let how = IssueWith {
            pdl: self.pdl,
            zero_func: self.zero_func,
            side: self.side.as_ref(),
        };
        if !self.graphs_on || self.cmds.len() < MIN_GRAPH_CMDS {
            self.stats.direct += 1;
            return issue(stream, &self.cmds, how);
        }
        self.tick += 1;
        let tick = self.tick;
        let bucket = self.graphs.entry(self.hash).or_default();
        if let Some(g) = bucket.iter_mut().find(|g| g.cmds == self.cmds) {
            g.seen += 1;
            g.last_use = tick;
            if let Some(graph) = &g.graph {
                self.stats.replayed += 1;
                return graph
                    .launch()
                    .map_err(|e| dev_err("launching a CUDA graph", e));
            }
            if g.seen == 2 {
                if let Some(graph) = capture(stream, &self.cmds, how)? {
                    graph
                        .launch()
                        .map_err(|e| dev_err("launching a CUDA graph", e))?;
                    self.stats.captured += 1;
                    g.graph = Some(graph);
                    return Ok(());
                }
            }
            self.stats.direct += 1;
            return issue(stream, &self.cmds, how);
        }
        self.stats.direct += 1;
        issue(stream, &self.cmds, how)?;
        bucket.push(Graph {
            cmds: self.cmds.clone(),
            graph: None,
            seen: 1,
            last_use: tick,
        });
        self.n_graphs += 1;
        if self.n_graphs > MAX_GRAPHS {
            self.evict_oldest();
        }
        Ok(())
    }

    /// Drops the least recently used command list and its graph.
    fn evict_oldest(&mut self) {
        let oldest = self
            .graphs
            .iter()
            .flat_map(|(&h, b)| b.iter().enumerate().map(move |(i, g)| (g.last_use, h, i)))
            .min();
        if let Some((_, h, i)) = oldest {
            let bucket = self.graphs.get_mut(&h).expect("bucket");
            bucket.swap_remove(i);
            if bucket.is_empty() {
                self.graphs.remove(&h);
            }
            self.n_graphs -= 1;
        }
    }
}

/// An owned device buffer (weights, KV pools) whose release waits for the
/// recorded commands that may read it: dropped while commands are
/// pending, it is kept until they are issued.
pub struct Deferred<T: Send + 'static> {
    inner: Option<T>,
    state: Arc<std::sync::Mutex<State>>,
}

impl<T: Send + 'static> Deferred<T> {
    pub fn new(inner: T, state: Arc<std::sync::Mutex<State>>) -> Deferred<T> {
        Deferred {
            inner: Some(inner),
            state,
        }
    }
}

impl<T: Send + 'static> std::ops::Deref for Deferred<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.inner.as_ref().expect("present until dropped")
    }
}

impl<T: Send + 'static> std::ops::DerefMut for Deferred<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.inner.as_mut().expect("present until dropped")
    }
}

impl<T: Send + 'static> Drop for Deferred<T> {
    fn drop(&mut self) {
        if let Some(v) = self.inner.take() {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if !st.cmds.is_empty() {
                st.graveyard.push(Box::new(v));
            }
        }
    }
}

/// The running hash of a command list (FxHash's mixing: recorded lists
/// are hashed word by word as they grow, at no cost at flush time).
struct Fx(u64);

impl Fx {
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// Captures `cmds` into an instantiated graph (None when the driver
/// refuses; the caller then issues directly).
fn capture(
    stream: &Arc<CudaStream>,
    cmds: &[Cmd],
    how: IssueWith<'_>,
) -> Result<Option<CudaGraph>, BackendError> {
    use sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL as MODE;
    if stream.begin_capture(MODE).is_err() {
        return Ok(None);
    }
    let issued = issue(stream, cmds, how);
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    issued?;
    Ok(graph.ok().flatten())
}

/// How a list is issued: the switches of [`State`] it reads.
#[derive(Clone, Copy, Default)]
pub struct IssueWith<'a> {
    /// [`State::pdl`].
    pub pdl: bool,
    /// [`State::zero_func`].
    pub zero_func: usize,
    /// [`State::side`].
    pub side: Option<&'a Side>,
}

/// `then` waits for the work `first` has so far, through `event`.
///
/// # Safety
///
/// Live handles of the context bound to this thread.
unsafe fn order(
    event: sys::CUevent,
    first: sys::CUstream,
    then: sys::CUstream,
    what: &str,
) -> Result<(), BackendError> {
    result::event::record(event, first)
        .and_then(|()| {
            result::stream::wait_event(then, event, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        })
        .map_err(|e| dev_err(what, e))
}

/// Issues `cmds` on `stream`; with `how.pdl`, kernels launch with
/// programmatic stream serialization (see [`State::pdl`]), and memsets
/// run as `how.zero_func` where it is not 0 ([`State::zero_func`]). The
/// commands between a [`Cmd::Fork`] and the [`Cmd::Back`] after it run on
/// `how.side` (without one, on `stream` in order); a fork still open at
/// the end is joined, so that a captured list is whole.
pub fn issue(stream: &CudaStream, cmds: &[Cmd], how: IssueWith<'_>) -> Result<(), BackendError> {
    let IssueWith {
        pdl,
        zero_func,
        side,
    } = how;
    let main = stream.cu_stream();
    let (mut s, mut open) = (main, false);
    let join = |open: &mut bool| -> Result<(), BackendError> {
        if let (true, Some(sd)) = (*open, side) {
            // SAFETY: live handles of this context (Side::new).
            unsafe { order(sd.join, sd.stream, main, "joining the side stream")? };
        }
        *open = false;
        Ok(())
    };
    let mut i = 0;
    while i < cmds.len() {
        let c = &cmds[i];
        i += 1;
        match (c, side) {
            (Cmd::Fork, Some(sd)) => {
                // A fork while one is open continues the side stream (its
                // commands stay in order there) after the main stream's.
                // SAFETY: live handles of this context (Side::new).
                unsafe { order(sd.fork, main, sd.stream, "forking the side stream")? };
                (s, open) = (sd.stream, true);
                continue;
            }
            (Cmd::Back, _) => {
                s = main;
                continue;
            }
            (Cmd::Join, _) => {
                s = main;
                join(&mut open)?;
                continue;
            }
            (Cmd::Fork, None) => continue,
            _ => {}
        }
        // Early launches only on the main stream.
        let pdl = pdl && s == main;
        if let (true, true, Cmd::Memset { dst, bytes }) = (pdl, zero_func != 0, c) {
            // The run of memsets that continue this one (arena tensors
            // made one after the other; the padding between them belongs
            // to no tensor): one launch.
            let (dst, mut end) = (*dst, *dst + *bytes as u64);
            while let Some(Cmd::Memset { dst: d, bytes: b }) = cmds.get(i) {
                if *d != end.next_multiple_of(super::arena::ALIGN as u64) {
                    break;
                }
                end = *d + *b as u64;
                i += 1;
            }
            let mut args = [dst, end - dst];
            let mut params = [std::ptr::null_mut::<c_void>(); 2];
            for (p, v) in params.iter_mut().zip(args.iter_mut()) {
                *p = (v as *mut u64).cast();
            }
            let blocks = (end - dst).div_ceil(ZERO_BLOCK_BYTES).clamp(1, 1024) as u32;
            // SAFETY: the range is arena memory of live tensors (see
            // below); zero_bytes(u8* dst, u64 bytes) takes two words.
            unsafe {
                launch_pdl(
                    zero_func as sys::CUfunction,
                    (blocks, 1, 1),
                    256,
                    0,
                    s,
                    &mut params,
                )
            }
            .map_err(|e| dev_err(&format!("issuing {}", describe(c)), e))?;
            continue;
        }
        // SAFETY: every command was recorded by an op wrapper that checked
        // its pointers and sizes against live allocations (weights, KV
        // pools, or arena memory that stays allocated until its region is
        // reset, which issues pending commands first); launch arguments
        // match the kernel's parameter list (see `launch!`).
        let r = unsafe {
            match c {
                Cmd::Launch {
                    func,
                    grid,
                    block,
                    smem,
                    n_args,
                    args,
                } => {
                    let mut a = *args;
                    let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
                    for (p, v) in params.iter_mut().zip(a.iter_mut()) {
                        *p = (v as *mut u64).cast();
                    }
                    let f = *func as sys::CUfunction;
                    if pdl {
                        launch_pdl(f, *grid, *block, *smem, s, &mut params)
                    } else {
                        result::launch_kernel(
                            f,
                            *grid,
                            (*block, 1, 1),
                            *smem,
                            s,
                            &mut params[..*n_args as usize],
                        )
                    }
                }
                Cmd::Memset { dst, bytes } => result::memset_d8_async(*dst, 0, *bytes, s),
                Cmd::HtoD { dst, src, bytes } => {
                    let host = std::slice::from_raw_parts(*src as *const u8, *bytes);
                    result::memcpy_htod_async(*dst, host, s)
                }
                Cmd::DtoD { dst, src, bytes } => result::memcpy_dtod_async(*dst, *src, *bytes, s),
                Cmd::Fork | Cmd::Back | Cmd::Join => unreachable!("handled above"),
            }
        };
        r.map_err(|e| dev_err(&format!("issuing {}", describe(c)), e))?;
    }
    join(&mut open)
}

/// `cuLaunchKernelEx` with programmatic stream serialization allowed: the
/// kernel may launch before the previous kernel in the stream finished
/// (it waits for it in `pdl_wait`).
///
/// # Safety
///
/// As for `cuLaunchKernel`: `params` point to the kernel's arguments.
unsafe fn launch_pdl(
    f: sys::CUfunction,
    grid: (u32, u32, u32),
    block: u32,
    smem: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), result::DriverError> {
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            programmaticStreamSerializationAllowed: 1,
        },
    };
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    sys::cuLaunchKernelEx(&cfg, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
}

fn describe(c: &Cmd) -> String {
    match c {
        Cmd::Launch { grid, block, .. } => {
            format!("a kernel launch (grid {grid:?}, {block} threads)")
        }
        Cmd::Memset { bytes, .. } => format!("a memset of {bytes} bytes"),
        Cmd::HtoD { bytes, .. } => format!("a host-to-device copy of {bytes} bytes"),
        Cmd::DtoD { bytes, .. } => format!("a device copy of {bytes} bytes"),
        Cmd::Fork => "a fork to the side stream".into(),
        Cmd::Back => "a return to the main stream".into(),
        Cmd::Join => "a join of the side stream".into(),
    }
}
