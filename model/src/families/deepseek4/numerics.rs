//! Which of the reference engine's activation roundings (spec §3.0,
//! §3.12) a forward pass applies: FP8 E4M3 on the non-rotary part of K/V
//! rows, the indexer's Hadamard-128 + FP4 E2M1, and f16 storage of cache
//! rows. Production numerics apply all of them, exact numerics none. The
//! roundings themselves are backend ops (`Backend::round_fp8`,
//! `Backend::round_indexer`; f16 rows are a property of the state pool).

/// Which roundings a forward pass applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ds4Numerics {
    /// FP8 on dims `0..head_dim - n_rot` of raw and compressed K/V rows.
    pub fp8_kv: bool,
    /// Hadamard + FP4 on indexer queries and indexer key rows.
    pub fp4_indexer: bool,
    /// Raw window rows and compressed rows stored at f16 precision.
    pub f16_cache: bool,
}

impl Ds4Numerics {
    /// The reference engine's serving numerics.
    pub const PRODUCTION: Ds4Numerics = Ds4Numerics {
        fp8_kv: true,
        fp4_indexer: true,
        f16_cache: true,
    };
    /// The model's math: no activation rounding.
    pub const EXACT: Ds4Numerics = Ds4Numerics {
        fp8_kv: false,
        fp4_indexer: false,
        f16_cache: false,
    };
}
