// The compressed-attention pool's state ops (prepended: common.cuh):
// frontier resets, raw-row stores and the compressors. Launched only by
// kernels/src/cuda/compressed.rs. The CPU reference is
// kernels/src/cpu/compressed.rs; the roundings are those of
// kernels/src/cpu/hyper.rs (fp8_blocks, indexer_head), bit for bit.
//
// Pool layout (CompressedPoolConfig; each block and window block holds
// exactly the bytes compressed_read_block / window_read return, at a
// stride padded to 256 bytes): a block holds, layer by layer, its pooled
// rows then (ratio 4) its indexer rows, in the row dtype (f16 bits or
// f32); a window block holds every layer's block_size raw rows, then the
// f32 carry. A slot holds each compressor's frontier: `rows x width`
// values, then as many scores.
//
// Per sequence the host passes seqinfo[8 * s ..] = {slot, block table
// offset, window table offset, first row, rows, first position, table
// length, 0} into `tab` (u32 block ids, then u32 window block ids;
// 0xffffffff: none); per row rowinfo[2 * r ..] = {sequence (-1: none),
// position}.

#define NEG_INF (-__int_as_float(0x7f800000))
// Widest pooled row (smem per block: 4 bytes a value).
#define CP_MAX_DIM 1024
#define CP_THREADS 256

__device__ __forceinline__ void st_row(u8* base, u64 i, float v, int f16) {
    if (f16)
        ((u16*)base)[i] = f2h(v);
    else
        ((float*)base)[i] = v;
}

// Frontier resets, one block per frontier of the slot: ftab[5 * i ..] =
// {offset in the slot, rows, width, dim, carry offset (-1: none)}. Values
// 0 and scores -inf; with a carry (the window block's, f32), rows 0..3,
// columns 0..dim-1 (the previous window's first lane) take its values at
// carry + q * dim and its scores at carry + (4 + q) * dim, as
// cpu/compressed.rs `begin` lays them out.
extern "C" __global__ void comp_begin(float* slots, u64 slot_off, const int* ftab, const float* carry) {
    pdl_wait();
    const int* f = ftab + 5 * blockIdx.x;
    int rows = f[1], width = f[2], dim = f[3], co = f[4];
    float* kst = slots + slot_off + (u64)f[0];
    u64 n = (u64)rows * width;
    float* sst = kst + n;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
        int row = (int)(i / width), col = (int)(i % width);
        bool seed = carry != nullptr && co >= 0 && row < 4 && col < dim;
        kst[i] = seed ? carry[co + row * dim + col] : 0.0f;
        sst[i] = seed ? carry[co + (4 + row) * dim + col] : NEG_INF;
    }
}

// One block per row: the row's raw K=V values into its window block
// (layer rows at layer * bs). Bound by the bytes moved.
extern "C" __global__ void window_store(const float* kv, const int* seqinfo, const int* rowinfo, const u32* tab,
                                        u8* windows, u64 wstride, int layer, int bs, int hd, int f16) {
    pdl_wait();
    int r = blockIdx.x;
    int s = rowinfo[2 * r];
    if (s < 0) return;
    int p = rowinfo[2 * r + 1];
    u32 w = tab[seqinfo[8 * s + 2] + p / bs];
    u8* base = windows + (u64)w * wstride;
    u64 at = ((u64)layer * bs + p % bs) * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) st_row(base, at + i, kv[(u64)r * hd + i], f16);
}

// ---- the compressor ------------------------------------------------------
//
// Flags: 1 f16 rows, 2 indexer compressor (else attention), 4 round, 8 the
// position bias is f16 (else f32).
//
// Frontier of ratio r (cpu/compressed.rs `compress`): rows 0..r-1 of the
// current window (one lane of `dim`), or for ratio 4 two lanes (width
// 2 * dim) in rows 0..3 (the previous window) and 4..7 (the current one).
// Position q's values and scores (+ the bias row q % r) go to row q % r,
// or 4 + q % 4; a completed window pools, per channel, a softmax of the
// scores weighting the values over its r rows, or for ratio 4 over the
// previous window's first lane and the current window's second lane.
//
// Two launches per call. compress_pool: a block per (sequence, window the
// call completes), reading each candidate from the call's rows when its
// position is in the call and from the frontier (as it was before the
// call) otherwise; windows are independent, so a prefill chunk pools all
// of its windows at once. compress_frontier then leaves the frontier as
// the token-by-token procedure would for the rows later calls read.
// Bound by the candidates read (r or 8 per channel of each pooled row).

__device__ __forceinline__ float ape_ld(const void* ape, u64 i, int flags) {
    return (flags & 8) ? h2f(((const u16*)ape)[i]) : ((const float*)ape)[i];
}

// Candidate i of window c for channel column j (values k, scores s).
struct Cand {
    const float* k;
    const float* s;
    const void* ape;
    const float* kst;
    const float* sst;
    int flags, dim, width, r, pos, cur, row0;

    // Position q's column col: from the call's rows or the frontier.
    __device__ __forceinline__ void at(int q, int col, float& kv, float& sv) const {
        if (q >= pos) {
            u64 rr = (u64)row0 + (q - pos);
            kv = k[rr * width + col];
            sv = __fadd_rn(s[rr * width + col], ape_ld(ape, (u64)(q % r) * width + col, flags));
            return;
        }
        int fr;
        if (r == 4)
            fr = q >= cur ? 4 + q % 4 : ((q % 4) + 4) % 4;
        else
            fr = q % r;
        kv = kst[(u64)fr * width + col];
        sv = sst[(u64)fr * width + col];
    }

    __device__ __forceinline__ void get(int c, int i, int j, float& kv, float& sv) const {
        if (r == 4) {
            if (i < 4)
                at(4 * c - 4 + i, j, kv, sv);  // previous window, first lane
            else
                at(4 * c + i - 4, dim + j, kv, sv);  // current window, second lane
        } else {
            at(c * r + i, j, kv, sv);
        }
    }
};

// 2^ceil(log2(amax / top)) as the CPU's block_scale computes it: amax /
// top in f64, the exponent exact (frexp: x = m 2^e, m in [0.5, 1)).
__device__ __forceinline__ float block_scale(float amax, float top) {
    double x = __ddiv_rn((double)amax, (double)top);
    int e;
    double m = frexp(x, &e);
    return ldexpf(1.0f, m == 0.5 ? e - 1 : e);
}

// Nearest E4M3FN magnitude of a in [0, 448], ties to the even code: the
// grid spacing is 2^-9 below 2^-6 and 2^(E-3) in binade [2^E, 2^(E+1)),
// where the code's parity is the mantissa's, so rint (ties to even) on
// the exactly scaled value picks the CPU's grid point.
__device__ __forceinline__ float round_e4m3(float a) {
    if (a < 0.015625f) return ldexpf(rintf(ldexpf(a, 9)), -9);
    int e;
    frexpf(a, &e);
    return ldexpf(rintf(ldexpf(a, 4 - e)), e - 4);
}

// Nearest E2M1 magnitude of a in [0, 6] (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties
// to the even code.
__device__ __forceinline__ float round_e2m1(float a) {
    if (a < 2.0f) return 0.5f * rintf(2.0f * a);
    if (a < 4.0f) return rintf(a);
    return 2.0f * rintf(0.5f * a);
}

__device__ __forceinline__ float sim_value(float x, float s, float top, bool e4m3) {
    float q = fminf(fmaxf(__fdiv_rn(x, s), -top), top);
    float a = fabsf(q);
    float g = e4m3 ? round_e4m3(a) : round_e2m1(a);
    return __fmul_rn(copysignf(g, q), s);
}

// The row's norm (RMSNorm * w), RoPE at position `rpos` on its last n_rot
// dims, and rounding, in place in v (shared memory, `dim` values); every
// thread of the block calls it.
__device__ void finish_row(float* v, int dim, const float* w, float eps, const double* omega, int n_rot,
                           u32 rpos, int flags) {
    __shared__ double s_ss[32];
    int tid = threadIdx.x, nt = blockDim.x, lane = tid % 32, warp = tid / 32, nw = nt / 32;
    // Sum of squares in f64 (each square is exact in f64; only the order
    // of the sum differs from the CPU's).
    double ss = 0.0;
    for (int j = tid; j < dim; j += nt) ss += (double)v[j] * (double)v[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
    if (lane == 0) s_ss[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        ss = lane < nw ? s_ss[lane] : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, o);
        if (lane == 0) s_ss[0] = ss;
    }
    __syncthreads();
    float sc = (float)__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(s_ss[0], (double)dim), (double)eps)));
    for (int j = tid; j < dim; j += nt) v[j] = __fmul_rn(__fmul_rn(v[j], sc), w[j]);
    __syncthreads();
    // RoPE of the tail pairs, in f64 like rope_tail_head.
    int start = dim - n_rot;
    for (int k = tid; k < n_rot / 2; k += nt) {
        double phi = __dmul_rn((double)rpos, omega[k]);
        double sn, cs;
        sincos(phi, &sn, &cs);
        double a = v[start + 2 * k], b = v[start + 2 * k + 1];
        v[start + 2 * k] = (float)__dsub_rn(__dmul_rn(a, cs), __dmul_rn(b, sn));
        v[start + 2 * k + 1] = (float)__dadd_rn(__dmul_rn(a, sn), __dmul_rn(b, cs));
    }
    __syncthreads();
    if (!(flags & 4)) return;
    if (flags & 2) {
        // Indexer: the normalized Walsh-Hadamard transform (the CPU's
        // butterflies, same f32 sums), then FP4 blocks of 32.
        for (int h = 1; h < dim; h <<= 1) {
            for (int t = tid; t < dim / 2; t += nt) {
                int i = (t / h) * 2 * h + t % h;
                float a = v[i], b = v[i + h];
                v[i] = __fadd_rn(a, b);
                v[i + h] = __fsub_rn(a, b);
            }
            __syncthreads();
        }
        float nrm = __fdiv_rn(1.0f, __fsqrt_rn((float)dim));
        for (int j = tid; j < dim; j += nt) v[j] = __fmul_rn(v[j], nrm);
        __syncthreads();
        for (int b = warp; b * 32 < dim; b += nw) {
            int i = 32 * b + lane;
            float x = i < dim ? v[i] : 0.0f;
            float amax = fmaxf(warp_max(fabsf(x)), ldexpf(6.0f, -126));
            float s = block_scale(amax, 6.0f);
            if (i < dim) v[i] = sim_value(x, s, 6.0f, false);
        }
    } else {
        // Attention: FP8 blocks of 64 over the first dim - n_rot values.
        int n_round = dim - n_rot;
        for (int b = warp; b * 64 < n_round; b += nw) {
            int end = min(64 * b + 64, n_round);
            int i0 = 64 * b + lane, i1 = i0 + 32;
            float x0 = i0 < end ? v[i0] : 0.0f, x1 = i1 < end ? v[i1] : 0.0f;
            float amax = fmaxf(warp_max(fmaxf(fabsf(x0), fabsf(x1))), 1e-4f);
            float s = block_scale(amax, 448.0f);
            if (i0 < end) v[i0] = sim_value(x0, s, 448.0f, true);
            if (i1 < end) v[i1] = sim_value(x1, s, 448.0f, true);
        }
    }
    __syncthreads();
}

// grid = (sequences, most windows one sequence can complete); block y of
// sequence s pools window pos / ratio + y when the call completes it
// (idle otherwise, so the grid depends only on the batch shape), then
// normalizes, rotates, rounds and stores the row in its block; a ratio-4
// window ending a block also writes its first lane (the carry) to that
// block's window block at carry_at (bytes).
extern "C" __global__ void __launch_bounds__(CP_THREADS)
    compress_pool(const float* k, const float* s, const void* ape, const float* norm, const double* omega,
                  const int* seqinfo, const u32* tab, const float* slots, u64 slot_values, u64 front_at,
                  u8* blocks, u64 bstride, u64 rows_at, u8* windows, u64 wstride, u64 carry_at, int dim,
                  int ratio, int bs, int n_rot, float eps, int flags) {
    pdl_wait();
    __shared__ float s_row[CP_MAX_DIM];
    const int* si = seqinfo + 8 * blockIdx.x;
    int slot = si[0], toff = si[1], woff = si[2], row0 = si[3], n = si[4], pos = si[5];
    int r = ratio;
    int c = pos / r + blockIdx.y;
    if ((c + 1) * r > pos + n) return;  // the window ends past the call's rows
    int width = r == 4 ? 2 * dim : dim;
    u64 n_front = (u64)(r == 4 ? 8 : r) * width;
    const float* kst = slots + (u64)slot * slot_values + front_at;
    Cand cd{k, s, ape, kst, kst + n_front, flags, dim, width, r, pos, pos - pos % r, row0};
    int nc = r == 4 ? 8 : r;
    bool carry = r == 4 && (4 * c + 4) % bs == 0;
    float* cw = carry ? (float*)(windows + (u64)tab[woff + (4 * c + 3) / bs] * wstride + carry_at) : nullptr;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float mx = NEG_INF;
        for (int i = 0; i < nc; i++) {
            float kv, sv;
            cd.get(c, i, j, kv, sv);
            mx = fmaxf(mx, sv);
        }
        float pooled = 0.0f;
        if (mx != NEG_INF) {
            // In f64 and in candidate order, as pool_channel does.
            double num = 0.0, den = 0.0;
            for (int i = 0; i < nc; i++) {
                float kv, sv;
                cd.get(c, i, j, kv, sv);
                double e = exp((double)__fsub_rn(sv, mx));
                num = __dadd_rn(num, __dmul_rn(e, (double)kv));
                den = __dadd_rn(den, e);
            }
            pooled = (float)__ddiv_rn(num, den);
        }
        s_row[j] = pooled;
        if (carry) {
            for (int i = 0; i < 4; i++) {
                float kv, sv;
                cd.at(4 * c + i, j, kv, sv);
                cw[i * dim + j] = kv;
                cw[(4 + i) * dim + j] = sv;
            }
        }
    }
    __syncthreads();
    finish_row(s_row, dim, norm, eps, omega, n_rot, (u32)(c * r), flags);
    u8* dst = blocks + (u64)tab[toff + c * r / bs] * bstride;
    u64 at = rows_at + (u64)(c % (bs / r)) * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) st_row(dst, at + j, s_row[j], flags & 1);
}

// grid = (sequences, dim / 128 rounded up): after compress_pool, thread j
// writes channel j (both lanes) of the frontier rows later calls read:
// the partial window at the end of the call and, for ratio 4 when the
// call completed a window, the last completed window into rows 0..3
// (from the call's rows, or from rows 4..7 for positions before the call:
// read before anything is written).
extern "C" __global__ void compress_frontier(const float* k, const float* s, const void* ape, const int* seqinfo,
                                             float* slots, u64 slot_values, u64 front_at, int dim, int ratio,
                                             int flags) {
    pdl_wait();
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    const int* si = seqinfo + 8 * blockIdx.x;
    int slot = si[0], row0 = si[3], n = si[4], pos = si[5];
    int r = ratio;
    int width = r == 4 ? 2 * dim : dim;
    u64 n_front = (u64)(r == 4 ? 8 : r) * width;
    float* kst = slots + (u64)slot * slot_values + front_at;
    float* sst = kst + n_front;
    int end = pos + n, e0 = end - end % r;
    int lanes = r == 4 ? 2 : 1;
    auto input = [&](int q, int col, float& kv, float& sv) {
        u64 rr = (u64)row0 + (q - pos);
        kv = k[rr * width + col];
        sv = __fadd_rn(s[rr * width + col], ape_ld(ape, (u64)(q % r) * width + col, flags));
    };
    if (r == 4 && end / 4 > pos / 4) {
        float kv[4][2], sv[4][2];
        for (int i = 0; i < 4; i++) {
            int q = e0 - 4 + i;
            for (int L = 0; L < 2; L++) {
                int col = L * dim + j;
                if (q >= pos) {
                    input(q, col, kv[i][L], sv[i][L]);
                } else {
                    kv[i][L] = kst[(u64)(4 + i) * width + col];
                    sv[i][L] = sst[(u64)(4 + i) * width + col];
                }
            }
        }
        for (int i = 0; i < 4; i++)
            for (int L = 0; L < 2; L++) {
                kst[(u64)i * width + L * dim + j] = kv[i][L];
                sst[(u64)i * width + L * dim + j] = sv[i][L];
            }
    }
    for (int q = max(pos, e0); q < end; q++) {
        int fr = r == 4 ? 4 + q % 4 : q % r;
        for (int L = 0; L < lanes; L++) {
            int col = L * dim + j;
            float kv, sv;
            input(q, col, kv, sv);
            kst[(u64)fr * width + col] = kv;
            sst[(u64)fr * width + col] = sv;
        }
    }
}
