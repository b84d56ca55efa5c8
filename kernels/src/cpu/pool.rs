//! Running a pass on rayon's pool with its workers kept awake.
//!
//! A forward pass is hundreds of short parallel regions (a decode step of
//! a small model: about 150 matmuls, each tens of microseconds) with
//! short serial stretches between them (quantizing activations, norms).
//! Left alone, an idle rayon worker sleeps within microseconds, and every
//! region then pays for waking it: a futex and, on a virtual machine, an
//! interrupt to a halted vCPU, often longer than the region's own work
//! (measured on a 2-vCPU VM: a fork-join after a 100 µs serial stretch
//! cost 11 µs with sleeping workers, 2-4 µs with spinning ones). So
//! during a pass every other worker runs a spinner that keeps taking jobs
//! ([`rayon::yield_now`]) until the pass is over.

use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `f` on a worker of rayon's global pool (handing it over from a
/// thread outside the pool, as [`rayon::scope`] does), while the pool's
/// other workers spin for jobs instead of sleeping. Returns `f`'s result;
/// a panic in `f` still releases the spinners, then propagates.
pub fn run_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        // The worker running `f` (the scope's own body runs there).
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            s.spawn(move |_| {
                // A spinner left in the owner's queue is found by the owner
                // itself while it waits inside `f`: spinning there would
                // never end, so it returns at once.
                if rayon::current_thread_index() == owner {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        // Released on return and on unwind alike, so that the scope,
        // which waits for every spinner, can end.
        struct Release<'a>(&'a AtomicBool);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _release = Release(&done);
        f()
    })
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;

    #[test]
    fn runs_parallel_work_and_returns_its_result() {
        let sum: u64 = run_awake(|| (0..10_000u64).into_par_iter().map(|x| x * x).sum());
        assert_eq!(sum, (0..10_000u64).map(|x| x * x).sum());
        // Nested: a pass inside a pass (the inner one on a worker).
        let n = run_awake(|| run_awake(|| (0..100u32).into_par_iter().count()));
        assert_eq!(n, 100);
    }

    #[test]
    fn a_panic_in_the_pass_ends_it_and_propagates() {
        let r = std::panic::catch_unwind(|| {
            run_awake(|| {
                (0..64u32)
                    .into_par_iter()
                    .for_each(|i| assert!(i != 40, "task 40"));
            })
        });
        assert!(r.is_err());
        // The pool still works afterwards.
        assert_eq!(run_awake(|| (0..8u32).into_par_iter().sum::<u32>()), 28);
    }
}
