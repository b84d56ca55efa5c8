//! The memory ledger: one budget for everything the engine allocates per
//! request (KV blocks) or per step (activation scratch, disk-cache reads).
//!
//! Fixed charges (scratch for the largest step, the disk read buffer, the
//! window blocks and frontier slots of the running sequences of
//! compressed-attention families) are taken first; what remains is the KV
//! pool, in whole blocks. Each request
//! reserves, when it is submitted, the blocks its prompt plus `max_tokens`
//! can fill; it is refused (retryably) when the reservations of the
//! requests already admitted leave too little. Idle cached prefixes do not
//! count: they are evicted when their blocks are needed. So an admitted
//! request always finds its blocks, and none is ever half-admitted.

/// Why the ledger cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("the KV memory budget of {budget_mb} MiB is too small: scratch and buffers take {fixed_mb} MiB and one {ctx}-token request needs {need_mb} MiB of KV blocks more; raise --kv-memory-gb or lower --ctx / --batch-tokens")]
    TooSmall {
        budget_mb: u64,
        fixed_mb: u64,
        need_mb: u64,
        ctx: usize,
    },
}

/// A request the ledger cannot take now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not enough KV cache memory: the request may use {needed} blocks of {block_size} tokens (prompt plus max_tokens), {available} of {capacity} are not reserved by running requests; retry later or ask for fewer max_tokens")]
pub struct Refusal {
    pub needed: usize,
    pub available: usize,
    pub capacity: usize,
    pub block_size: usize,
}

/// What the budget is spent on, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LedgerView {
    pub budget_bytes: u64,
    pub scratch_bytes: u64,
    pub disk_buffer_bytes: u64,
    /// Window blocks and frontier slots (compressed-attention families).
    pub sequence_bytes: u64,
    pub kv_block_bytes: u64,
    pub kv_blocks: usize,
    pub reserved_blocks: usize,
}

#[derive(Debug)]
pub struct Ledger {
    view: LedgerView,
    block_size: usize,
}

impl Ledger {
    /// Split `budget` bytes: fixed charges first, the rest into KV blocks of
    /// `block_bytes` bytes holding `block_size` tokens; at least one request
    /// of `ctx` tokens must fit.
    pub fn new(
        budget: u64,
        scratch: u64,
        disk_buffer: u64,
        sequences: u64,
        block_bytes: u64,
        block_size: usize,
        ctx: usize,
    ) -> Result<Ledger, LedgerError> {
        let fixed = scratch + disk_buffer + sequences;
        let per_request = ctx.div_ceil(block_size) as u64 * block_bytes;
        if budget < fixed + per_request {
            let mb = |b: u64| b.div_ceil(1 << 20);
            return Err(LedgerError::TooSmall {
                budget_mb: mb(budget),
                fixed_mb: mb(fixed),
                need_mb: mb(per_request),
                ctx,
            });
        }
        Ok(Ledger {
            view: LedgerView {
                budget_bytes: budget,
                scratch_bytes: scratch,
                disk_buffer_bytes: disk_buffer,
                sequence_bytes: sequences,
                kv_block_bytes: block_bytes,
                kv_blocks: ((budget - fixed) / block_bytes) as usize,
                reserved_blocks: 0,
            },
            block_size,
        })
    }

    pub fn view(&self) -> LedgerView {
        self.view
    }

    /// Blocks a request of `tokens` tokens (prompt plus completion) may fill.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Reserve `blocks` for one request, or refuse it.
    pub fn reserve(&mut self, blocks: usize) -> Result<(), Refusal> {
        let v = &mut self.view;
        let available = v.kv_blocks - v.reserved_blocks;
        if blocks > available {
            return Err(Refusal {
                needed: blocks,
                available,
                capacity: v.kv_blocks,
                block_size: self.block_size,
            });
        }
        v.reserved_blocks += blocks;
        Ok(())
    }

    /// Give back a finished request's reservation.
    pub fn release(&mut self, blocks: usize) {
        debug_assert!(blocks <= self.view.reserved_blocks);
        self.view.reserved_blocks -= blocks.min(self.view.reserved_blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_charges_come_first_and_the_rest_is_whole_blocks() {
        let l = Ledger::new(1000, 100, 50, 0, 100, 16, 32).unwrap();
        assert_eq!(l.view().kv_blocks, 8);
        let l = Ledger::new(1000, 100, 50, 200, 100, 16, 32).unwrap();
        assert_eq!(l.view().kv_blocks, 6);
        assert!(matches!(
            Ledger::new(300, 100, 50, 0, 100, 16, 32),
            Err(LedgerError::TooSmall { .. })
        ));
    }

    #[test]
    fn reservations_never_exceed_the_pool() {
        let mut l = Ledger::new(1000, 0, 0, 0, 100, 16, 32).unwrap();
        assert_eq!(l.blocks_for(33), 3);
        l.reserve(6).unwrap();
        let r = l.reserve(5).unwrap_err();
        assert_eq!((r.needed, r.available, r.capacity), (5, 4, 10));
        l.reserve(4).unwrap();
        l.release(6);
        l.reserve(5).unwrap();
        assert_eq!(l.view().reserved_blocks, 9);
    }
}
