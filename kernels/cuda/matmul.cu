// Matrix multiplication out[t, r] = W[r, :] . x[t, :] over GGUF weight
// rows (prepended: common.cuh, quant.cuh). Launched only by
// kernels/src/cuda/matmul.rs.
//
// Production numerics (as the CPU reference): activations are first
// quantized to the weight's vec_dot_type (act_q8_0 / act_q8_k below, or
// inside the norm / SwiGLU kernel that produced them: quant_warp256 in
// quant.cuh, bit-identical to kernels/src/quant/activation.rs) into a split
// layout: quants aq [n_tok, n_in] i8, block scales ad [n_tok, n_in / 32]
// f32 (Q8_0/Q8_1: the f16-rounded d per 32; Q8_K: d per 256 in the first
// n_in / 256 entries), Q8_1 sums as [n_tok, n_in / 32] f32 (f16-rounded),
// Q8_K 16-value sums bs [n_tok, n_in / 16] i32. Dot products are exact in
// integers per block (dp4a) and scaled per block with the CPU's formula;
// only the float summation order over blocks differs from the CPU.
//
// Exact numerics: weight chunks dequantized in registers, f32 dots.
//
// Kernels here: decode matvecs (mv*, one token), the dp4a batch kernel
// (mmq8: one warp per weight row and 8 tokens, the chunk unpacked once for
// all of them, 32-value chunks strided over the lanes, each lane's scaled
// sums added by the warp at the end; grid = (ceil(n_out / 4),
// ceil(n_tok / 8)), 128 threads), the multi-token Q4_K matvec (mvt*),
// the register-fragment tensor-core kernel (mma, where matmul_tiled.cu's shared memory does not
// fit) and the exact-numerics float kernels (mmf*).

#define MM_WARPS 4

// ---- activation quantization -------------------------------------------

// One warp per 256 values (quant_warp256); n = n_tok * n_in values,
// n_in % 32 == 0; 256-thread blocks.
extern "C" __global__ void act_q8_0(const float* x, i8* aq, float* ad, float* as, int n, int with_sum) {
    pdl_wait();
    u64 flat = ((u64)blockIdx.x * 8 + threadIdx.x / WARP) * 256;
    if (flat >= (u64)n) return;  // whole warp out
    float v[8];
    bool valid = load_warp256(x + flat, (int)min((u64)256, n - flat), v);
    quant_warp256(v, valid, with_sum ? 1 : 0, flat, 0, aq, ad, as, nullptr);
}

// One warp per 256-value super-block; n_in % 256 == 0; 256-thread blocks.
extern "C" __global__ void act_q8_k(const float* x, i8* aq, float* ad, int* bs, int n, int n_in) {
    pdl_wait();
    u64 flat = ((u64)blockIdx.x * 8 + threadIdx.x / WARP) * 256;
    if (flat >= (u64)n) return;
    float v[8];
    load_warp256(x + flat, 256, v);
    quant_warp256(v, true, 2, flat, n_in, aq, ad, nullptr, bs);
}

// Round to f16 precision (the F16 weight's vec_dot_type).
extern "C" __global__ void round_f16(const float* x, float* y, int n) {
    pdl_wait();
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) y[g] = h2f(f2h(x[g]));
}

// ---- quantized x quantized (production) --------------------------------

// The integer dot of one 32-value weight chunk (quants q, half scales s0,
// s1, min scale m) with the activation chunk at a (32 int8, 16-byte
// aligned): isum = s0 * dot(first 16) + s1 * dot(last 16); for Q8_K
// activations also summs = m * the chunk's two 16-value sums at bsp.
template <class T>
__device__ __forceinline__ void chunk_dot(const int* q, int s0, int s1, int m, const i8* a, const int* bsp,
                                          int& isum, int& summs) {
    const int4* ap = (const int4*)a;
    int4 a0 = ap[0], a1 = ap[1];
    int lo = 0, hi = 0;
    lo = __dp4a(q[0], a0.x, lo);
    lo = __dp4a(q[1], a0.y, lo);
    lo = __dp4a(q[2], a0.z, lo);
    lo = __dp4a(q[3], a0.w, lo);
    hi = __dp4a(q[4], a1.x, hi);
    hi = __dp4a(q[5], a1.y, hi);
    hi = __dp4a(q[6], a1.z, hi);
    hi = __dp4a(q[7], a1.w, hi);
    isum = s0 * lo + s1 * hi;
    if (T::ACT == 2) summs = chunk_min_term<T>(m, bsp[0], bsp[1]);
}



// The end of a warp-per-row matvec (mm_q, mm_f, mm_f16): each token's
// lane sums added over the warp, lane 0 writing the row's output.
template <int NT>
__device__ __forceinline__ void mm_store(const float* acc, float* out, int row, int n_out, int t0, int n_tok) {
    int lane = threadIdx.x % WARP;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        int tok = t0 + t;
        float v = warp_sum(acc[t]);
        if (lane == 0 && tok < n_tok) out[(u64)tok * n_out + row] = v;
    }
}

template <class T, int NT>
__device__ __forceinline__ void mm_q(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                     const float* as, const int* bs, float* out, int n_out,
                                     int n_in, int n_tok) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row = blockIdx.x * MM_WARPS + warp;
    if (row >= n_out) return;
    int t0 = blockIdx.y * NT;
    const u8* wr = W + (u64)row * row_bytes;
    int nch = n_in / 32;
    int nab = n_in / 32;  // stride of ad / as per token
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int base = 0; base < nch; base += WARP) {
        int c = base + lane;
        if (c >= nch) continue;
        int b = c / T::NSUB, sub = c % T::NSUB;
        const u8* blk = wr + (u64)b * T::BYTES;
        int q[8];
        int s0 = 0, s1 = 0, m = 0;
        load_chunk<T>(blk, sub, q, s0, s1, m);
        // combine is linear in the integer sums, so each lane scales its
        // own chunk's (for K-quants, 1 / NSUB of the block's) and keeps a
        // float sum per token; the warp adds them at the end.
        u32 h = T::hdr(blk);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int tok = t0 + t;
            if (tok >= n_tok) break;  // uniform over the warp
            int isum = 0, summs = 0;
            chunk_dot<T>(q, s0, s1, m, aq + (u64)tok * n_in + 32 * (u64)c, bs + (u64)tok * (n_in / 16) + 2 * c,
                         isum, summs);
            u64 ai = (u64)tok * nab + b;
            acc[t] += T::combine_h(h, isum, summs, ad[ai], T::ACT == 1 && sub == 0 ? as[ai] : 0.0f);
        }
    }
    mm_store<NT>(acc, out, row, n_out, t0, n_tok);
}

// ---- one token (decode), production ------------------------------------
//
// Bandwidth-bound: every weight byte is read once. TPR threads (32, 64 or
// 128: whole warps) share one weight row, each taking every TPR-th
// 32-value chunk, so that rows of a few thousand values still spread over
// enough threads to keep the memory system busy (one chunk per thread and
// iteration keeps registers, and so occupancy, where it must be); a
// 128-thread block holds 128 / TPR rows. The integer work per chunk is
// mm_q's. grid = ceil(n_out / (128 / TPR)).

// The row's sum over its TPR threads to out[row] (+ bias[row], rounded as
// a separate add_bias would be).
template <int TPR>
__device__ __forceinline__ void mv_store(float acc, float* s_part, bool live, int g, int row, float* out,
                                         const float* bias) {
    acc = warp_sum(acc);
    if (TPR > WARP) {
        if (threadIdx.x % WARP == 0) s_part[threadIdx.x / WARP] = acc;
        __syncthreads();
        int first = (threadIdx.x - g) / WARP;  // the row's first warp
        acc = 0.0f;
        for (int w = 0; w < TPR / WARP; w++) acc += s_part[first + w];
    }
    if (live && g == 0) out[row] = bias ? __fadd_rn(acc, bias[row]) : acc;
}

template <class T, int TPR>
__device__ __forceinline__ void mv_q(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                     const float* as, const int* bs, float* out, int n_out,
                                     int n_in, const float* bias, int bx) {
    __shared__ float s_part[128 / WARP];
    int g = threadIdx.x % TPR;                      // thread within the row
    int row = bx * (128 / TPR) + threadIdx.x / TPR;
    bool live = row < n_out;                        // uniform per warp
    const u8* wr = W + (u64)min(row, n_out - 1) * row_bytes;
    int nch = n_in / 32;
    float acc = 0.0f;
    if (live) prefetch_l2(wr, row_bytes, (u64)n_out * row_bytes, g, TPR);
    pdl_wait();
    if (live) {
#pragma unroll 4
        for (int base = 0; base < nch; base += TPR) {
            int c = base + g;
            bool ok = c < nch;
            int b = c / T::NSUB, sub = c % T::NSUB;
            const u8* blk = wr + (u64)b * T::BYTES;
            int q[8];
            int s0 = 0, s1 = 0, m = 0;
            int isum = 0, summs = 0;
            if (ok) {
                load_chunk<T>(blk, sub, q, s0, s1, m);
                chunk_dot<T>(q, s0, s1, m, aq + 32 * (u64)c, bs + 2 * c, isum, summs);
            }
#pragma unroll
            for (int o = T::NSUB / 2; o > 0; o >>= 1) {
                isum += __shfl_xor_sync(FULL_MASK, isum, o);
                summs += __shfl_xor_sync(FULL_MASK, summs, o);
            }
            if (ok && sub == 0)
                acc += combine<T>(blk, isum, summs, ad[b], T::ACT == 1 ? as[b] : 0.0f);
        }
    }
    mv_store<TPR>(acc, s_part, live, g, row, out, bias);
}

// Decode entry points take up to three matrices of one type and width,
// applied to the same activation in one launch (q/k/v, gate/up): blocks
// [0, e0) compute matrix 0, [e0, e1) matrix 1, [e1, grid) matrix 2. A
// single matrix has e0 = e1 = grid. Matrix i: weights Wi (rows of rb
// bytes), ni rows into oi, optional bias bi.
#define MV_PARAMS                                                                                \
    const u8 *W0, float *o0, int n0, const float *b0, const u8 *W1, float *o1, int n1,          \
        const float *b1, const u8 *W2, float *o2, int n2, const float *b2, int e0, int e1,      \
        u64 rb, const i8 *aq, const float *ad, const float *as, const int *bs, int n_in
#define MV_PICK                                                                                  \
    int bx = blockIdx.x;                                                                         \
    const u8* W = W0;                                                                            \
    float* out = o0;                                                                             \
    int n_out = n0;                                                                              \
    const float* bias = b0;                                                                      \
    if (bx >= e1) {                                                                              \
        bx -= e1; W = W2; out = o2; n_out = n2; bias = b2;                                       \
    } else if (bx >= e0) {                                                                       \
        bx -= e0; W = W1; out = o1; n_out = n1; bias = b1;                                       \
    }

// The two integer dots of a Q4_K unit: 16 bytes of quants w (low nibbles:
// 16 values of chunk 2k, high nibbles: the same 16 of chunk 2k + 1) with
// the matching 16 activation quants of each chunk.
__device__ __forceinline__ void q4k16_dots(uint4 w, int4 a0, int4 a1, int& d0, int& d1) {
    const u32 M = 0x0f0f0f0fu;
    d0 = 0;
    d1 = 0;
    d0 = __dp4a((int)(w.x & M), a0.x, d0);
    d0 = __dp4a((int)(w.y & M), a0.y, d0);
    d0 = __dp4a((int)(w.z & M), a0.z, d0);
    d0 = __dp4a((int)(w.w & M), a0.w, d0);
    d1 = __dp4a((int)((w.x >> 4) & M), a1.x, d1);
    d1 = __dp4a((int)((w.y >> 4) & M), a1.y, d1);
    d1 = __dp4a((int)((w.z >> 4) & M), a1.z, d1);
    d1 = __dp4a((int)((w.w >> 4) & M), a1.w, d1);
}

// Q4_K, one token, weights 16-byte aligned: the unit of a thread is half
// of a pair of chunks (16 bytes of quants: values 16h .. 16h + 15 of
// chunks 2k (low nibbles) and 2k + 1 (high nibbles)), read with one
// 16-byte load. The 8 threads of a super-block add their integer sums
// (exact, so the block's sums equal mv_q's) and one applies combine.
template <int TPR>
__device__ __forceinline__ void mv_q4k16(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                         const int* bs, float* out, int n_out, int n_in,
                                         const float* bias, int bx) {
    __shared__ float s_part[128 / WARP];
    int g = threadIdx.x % TPR;
    int row = bx * (128 / TPR) + threadIdx.x / TPR;
    bool live = row < n_out;
    const u8* wr = W + (u64)min(row, n_out - 1) * row_bytes;
    int nu = n_in / 32;  // units per row (as many as chunks)
    float acc = 0.0f;
    if (live) prefetch_l2(wr, row_bytes, (u64)n_out * row_bytes, g, TPR);
    pdl_wait();
    if (live) {
#pragma unroll 4
        for (int base = 0; base < nu; base += TPR) {
            int e = base + g;
            bool ok = e < nu;
            int b = e / 8, k = (e % 8) / 2, h = e % 2;
            const u8* blk = wr + (u64)b * 144;
            int isum = 0, summs = 0;
            if (ok) {
                uint4 w = *(const uint4*)(blk + 16 + 32 * k + 16 * h);
                int c0 = 8 * b + 2 * k;
                int4 a0 = *(const int4*)(aq + 32 * (u64)c0 + 16 * h);
                int4 a1 = *(const int4*)(aq + 32 * (u64)(c0 + 1) + 16 * h);
                int sc0, mn0, sc1, mn1;
                k4_scale_min(blk + 4, 2 * k, sc0, mn0);
                k4_scale_min(blk + 4, 2 * k + 1, sc1, mn1);
                int d0, d1;
                q4k16_dots(w, a0, a1, d0, d1);
                isum = sc0 * d0 + sc1 * d1;
                summs = mn0 * bs[2 * c0 + h] + mn1 * bs[2 * (c0 + 1) + h];
            }
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) {
                isum += __shfl_xor_sync(FULL_MASK, isum, o);
                summs += __shfl_xor_sync(FULL_MASK, summs, o);
            }
            if (ok && e % 8 == 0) acc += combine<TQ4_K>(blk, isum, summs, ad[b], 0.0f);
        }
    }
    mv_store<TPR>(acc, s_part, live, g, row, out, bias);
}

// Q8_0, one token, rows staged in shared memory. Q8_0 blocks are 34
// bytes, so mv_q's threads, each reading its own blocks with 2-byte
// loads, touch a new 128-byte line every few lanes: the L1's wavefronts
// rather than DRAM then bound the matvec. Here each warp copies its whole
// weight row into shared memory with 16-byte asynchronous copies
// (consecutive lanes, consecutive bytes; all of a row in flight at once,
// issued before pdl_wait since weights do not depend on the kernel
// before), then lane l takes blocks l, l + 32, ... from shared memory as
// 4-byte words (the quants of an even block start 2 bytes past a word:
// funnel shifts). Each block's term is combine's, and lane 0 adds the
// row's terms in block order from 0, as the tensor-core GEMMs
// (mm_mma, matmul_tiled.cu) and moe.cu's matvecs do: a row's result has
// the same bits whichever path its batch takes. Needs rows of a multiple
// of 256 values (row bytes a multiple of 16, rows 16-byte aligned) and
// at most 32 * MVS_MAXB blocks. One warp per row, MVS_WARPS rows a block,
// dynamic shared memory MVS_WARPS * (row bytes + 16). Row r reads the
// activation row r / group_rows (matmul_grouped: the group of r;
// group_rows = n_out for a plain matvec).
#define MVS_WARPS 4  // rows per block (matmul.rs MVS_ROWS)
#define MVS_MAXB 8   // blocks per lane: rows of at most 8192 values (MVS_MAX_IN)

__device__ __forceinline__ void mvs_q8_0(const u8* W, u64 rb, const i8* aq, const float* ad, float* out,
                                         int n_out, int n_in, const float* bias, int bx, int group_rows) {
    extern __shared__ __align__(16) u8 mvs_smem[];
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row = bx * MVS_WARPS + warp;
    bool live = row < n_out;  // uniform per warp
    u8* buf = mvs_smem + (u64)warp * (rb + 16);
    if (live) {
        const u8* src = W + (u64)row * rb;
        for (u64 off = 16 * (u64)lane; off < rb; off += 16 * WARP) cp_async16(buf + off, src + off);
        cp_async_commit();
    }
    pdl_wait();
    if (!live) return;
    cp_async_wait<0>();
    __syncwarp();
    int g = row / group_rows;
    const i8* a = aq + (u64)g * n_in;
    const float* d = ad + (u64)g * (n_in / 32);
    int nb = n_in / 32;
    float term[MVS_MAXB];
#pragma unroll
    for (int k = 0; k < MVS_MAXB; k++) {
        int b = lane + k * WARP;
        term[k] = 0.0f;
        if (b < nb) {
            int off = 34 * b + 2;  // the block's quants
            const u32* wp = (const u32*)(buf + (off & ~3));
            u32 sh = 8 * (off & 3);
            u32 w[9];
#pragma unroll
            for (int i = 0; i < 9; i++) w[i] = wp[i];
            const int4* ap = (const int4*)(a + 32 * (u64)b);
            int4 a0 = ap[0], a1 = ap[1];
            int lo = 0, hi = 0;
            lo = __dp4a((int)__funnelshift_r(w[0], w[1], sh), a0.x, lo);
            lo = __dp4a((int)__funnelshift_r(w[1], w[2], sh), a0.y, lo);
            lo = __dp4a((int)__funnelshift_r(w[2], w[3], sh), a0.z, lo);
            lo = __dp4a((int)__funnelshift_r(w[3], w[4], sh), a0.w, lo);
            hi = __dp4a((int)__funnelshift_r(w[4], w[5], sh), a1.x, hi);
            hi = __dp4a((int)__funnelshift_r(w[5], w[6], sh), a1.y, hi);
            hi = __dp4a((int)__funnelshift_r(w[6], w[7], sh), a1.z, hi);
            hi = __dp4a((int)__funnelshift_r(w[7], w[8], sh), a1.w, hi);
            u32 h = *(const u16*)(buf + 34 * b);
            term[k] = TQ8_0::combine_h(h, lo + hi, 0, d[b], 0.0f);
        }
    }
    __syncwarp();  // every lane has read its blocks: the buffer takes the terms
    float* tb = (float*)buf;
#pragma unroll
    for (int k = 0; k < MVS_MAXB; k++) {
        int b = lane + k * WARP;
        if (b < nb) tb[b] = term[k];
    }
    __syncwarp();
    if (lane == 0) {
        float acc = 0.0f;
        for (int b = 0; b < nb; b++) acc = __fadd_rn(acc, tb[b]);
        out[row] = bias ? __fadd_rn(acc, bias[row]) : acc;
    }
}

extern "C" __global__ void __launch_bounds__(128) mvs_q8_0(MV_PARAMS) {
    MV_PICK
    mvs_q8_0(W, rb, aq, ad, out, n_out, n_in, bias, bx, n_out);
}

// matmul_grouped's one-row case: row r of the stacked weight reads group
// r / group_rows of the activation and writes out[r].
extern "C" __global__ void __launch_bounds__(128) mvsg_q8_0(const u8* W, u64 rb, const i8* aq, const float* ad,
                                                           float* out, int n_out, int n_in, int group_rows) {
    mvs_q8_0(W, rb, aq, ad, out, n_out, n_in, nullptr, blockIdx.x, group_rows);
}

// matmul_grouped's one-row case through mv_q (TPR threads a row, the
// dense decode matvec's sums, not a batch's order): row r of the stacked
// weight reads activation group r / group_rows. A block's 128 / TPR rows
// share one group (matmul.rs: group_rows a multiple of them).
#define MVG_Q8_0(TPR)                                                                            \
    extern "C" __global__ void __launch_bounds__(128) mvg##TPR##_q8_0(                            \
        const u8* W, u64 rb, const i8* aq, const float* ad, float* out, int n_out, int n_in,     \
        int group_rows) {                                                                        \
        u64 g = (u64)(blockIdx.x * (128 / TPR)) / (u64)group_rows;                               \
        mv_q<TQ8_0, TPR>(W, rb, aq + g * n_in, ad + g * (n_in / 32), nullptr, nullptr, out, n_out, \
                         n_in, nullptr, blockIdx.x);                                             \
    }
MVG_Q8_0(32)
MVG_Q8_0(64)
MVG_Q8_0(128)

extern "C" __global__ void __launch_bounds__(128) mv32_q4_k16(MV_PARAMS) {
    MV_PICK
    mv_q4k16<32>(W, rb, aq, ad, bs, out, n_out, n_in, bias, bx);
}

extern "C" __global__ void __launch_bounds__(128) mv64_q4_k16(MV_PARAMS) {
    MV_PICK
    mv_q4k16<64>(W, rb, aq, ad, bs, out, n_out, n_in, bias, bx);
}

extern "C" __global__ void __launch_bounds__(128) mv128_q4_k16(MV_PARAMS) {
    MV_PICK
    mv_q4k16<128>(W, rb, aq, ad, bs, out, n_out, n_in, bias, bx);
}

// The 16-byte units base + 32 u + lane (u < U) of R Q4_K rows (mv_q4k16's
// halves of chunk pairs: unit e holds values 16 (e % 2) .. + 15 of chunks
// 2k and 2k + 1, k = (e % 8) / 2, of super-block e / 8), zeros past the
// row's nu units: all R * U loads issued before any is used.
template <int R, int U>
__device__ __forceinline__ void q4k_units(const u8* const* wr, int base, int lane, int nu, uint4 (&w)[R][U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        int e = base + 32 * u + lane;
        int b = e / 8, k = (e % 8) / 2, h = e % 2;
#pragma unroll
        for (int r = 0; r < R; r++)
            w[r][u] = e < nu ? *(const uint4*)(wr[r] + (u64)b * 144 + 16 + 32 * k + 16 * h) : make_uint4(0, 0, 0, 0);
    }
}

// Q4_K, one token, weights 16-byte aligned, a warp per R rows: lane takes
// units (mv_q4k16's 16-byte halves of chunk pairs) lane + 32 u, u < U, of
// every 32 * U, and issues all R * U weight loads before using any, so
// that each lane keeps R * U * 16 bytes in flight; the activation loads
// are shared by the R rows. grid = ceil(n_out / (4 * R)), 128 threads.
template <int R, int U>
__device__ __forceinline__ void mv_q4k_w(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                         const int* bs, float* out, int n_out, int n_in,
                                         const float* bias, int bx) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row0 = (bx * 4 + warp) * R;
    if (row0 >= n_out) return;
    const u8* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = W + (u64)min(row0 + r, n_out - 1) * row_bytes;
#pragma unroll
    for (int r = 0; r < R; r++) prefetch_l2(wr[r], row_bytes, (u64)n_out * row_bytes, lane, WARP);
    pdl_wait();
    int nu = n_in / 32;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int base = 0; base < nu; base += 32 * U) {
        uint4 w[R][U];
        q4k_units<R, U>(wr, base, lane, nu, w);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int e = base + 32 * u + lane;
            bool ok = e < nu;
            int b = e / 8, k = (e % 8) / 2, h = e % 2;
            int c0 = 8 * b + 2 * k;
            int4 a0 = make_int4(0, 0, 0, 0), a1 = a0;
            int bs0 = 0, bs1 = 0;
            if (ok) {
                a0 = *(const int4*)(aq + 32 * (u64)c0 + 16 * h);
                a1 = *(const int4*)(aq + 32 * (u64)(c0 + 1) + 16 * h);
                bs0 = bs[2 * c0 + h];
                bs1 = bs[2 * (c0 + 1) + h];
            }
            float adb = ok ? ad[b] : 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const u8* blk = wr[r] + (u64)b * 144;
                int sc0 = 0, mn0 = 0, sc1 = 0, mn1 = 0;
                if (ok) {
                    k4_scale_min(blk + 4, 2 * k, sc0, mn0);
                    k4_scale_min(blk + 4, 2 * k + 1, sc1, mn1);
                }
                int d0, d1;
                q4k16_dots(w[r][u], a0, a1, d0, d1);
                int isum = sc0 * d0 + sc1 * d1;
                int summs = mn0 * bs0 + mn1 * bs1;
#pragma unroll
                for (int o = 4; o > 0; o >>= 1) {
                    isum += __shfl_xor_sync(FULL_MASK, isum, o);
                    summs += __shfl_xor_sync(FULL_MASK, summs, o);
                }
                if (ok && e % 8 == 0) acc[r] += combine<TQ4_K>(blk, isum, summs, adb, 0.0f);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        int row = row0 + r;
        if (lane == 0 && row < n_out) out[row] = bias ? __fadd_rn(v, bias[row]) : v;
    }
}

// Two rows per warp, two units per lane in flight per row: 2.2 TB/s on an
// H200 for 18944 x 3584 (mv128_q4_k16: 1.7), slower below ~1024 rows.
// At most 80 registers (6 blocks per SM): choosing among three matrices
// took it to 96 and 5 blocks, and the 7B's decode step 4% slower.
extern "C" __global__ void __launch_bounds__(128, 6) mvr2_q4_k16(MV_PARAMS) {
    MV_PICK
    mv_q4k_w<2, 2>(W, rb, aq, ad, bs, out, n_out, n_in, bias, bx);
}

// Q4_K, a few tokens (several decode streams), weights 16-byte aligned:
// mv_q4k_w's layout (a warp per R rows, lanes over the rows' 16-byte
// units, U units of each row loaded before any is used), each unit dotted
// against NT tokens, its scales unpacked once for all of them. A lane
// keeps a float partial sum per (row, token), the unit's exact integer
// dots scaled by combine (the CPU's formula); the warp adds the lanes'
// sums at the end, so only the float order over units differs from the
// CPU. grid = (ceil(n_out / (4 * R)), ceil(n_tok / NT)), 128 threads.
template <int NT>
__device__ __forceinline__ void mvt_q4k(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                        const int* bs, float* out, int n_out, int n_in, int n_tok) {
    constexpr int R = 2, U = 2;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row0 = (blockIdx.x * 4 + warp) * R;
    int t0 = blockIdx.y * NT;
    const u8* wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = W + (u64)min(row0 + r, n_out - 1) * row_bytes;
    pdl_wait();
    if (row0 >= n_out) return;
    int nu = n_in / 32, nab = n_in / 32, nbs = n_in / 16;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (int base = 0; base < nu; base += 32 * U) {
        uint4 w[R][U];
        q4k_units<R, U>(wr, base, lane, nu, w);
#pragma unroll
        for (int u = 0; u < U; u++) {
            int e = base + 32 * u + lane;
            if (e >= nu) continue;
            int b = e / 8, k = (e % 8) / 2, h = e % 2;
            int c0 = 8 * b + 2 * k;
            int sc0[R], mn0[R], sc1[R], mn1[R];
            u32 hdr[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                const u8* blk = wr[r] + (u64)b * 144;
                k4_scale_min(blk + 4, 2 * k, sc0[r], mn0[r]);
                k4_scale_min(blk + 4, 2 * k + 1, sc1[r], mn1[r]);
                hdr[r] = TQ4_K::hdr(blk);
            }
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int tok = t0 + t;
                if (tok >= n_tok) break;  // uniform over the warp
                const i8* at = aq + (u64)tok * n_in;
                int4 a0 = *(const int4*)(at + 32 * (u64)c0 + 16 * h);
                int4 a1 = *(const int4*)(at + 32 * (u64)(c0 + 1) + 16 * h);
                const int* bt = bs + (u64)tok * nbs;
                int bs0 = bt[2 * c0 + h], bs1 = bt[2 * (c0 + 1) + h];
                float adb = ad[(u64)tok * nab + b];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int d0, d1;
                    q4k16_dots(w[r][u], a0, a1, d0, d1);
                    int isum = sc0[r] * d0 + sc1[r] * d1;
                    int summs = mn0[r] * bs0 + mn1[r] * bs1;
                    acc[r][t] += TQ4_K::combine_h(hdr[r], isum, summs, adb, 0.0f);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = warp_sum(acc[r][t]);
            int row = row0 + r, tok = t0 + t;
            if (lane == 0 && row < n_out && tok < n_tok) out[(u64)tok * n_out + row] = v;
        }
}

extern "C" __global__ void __launch_bounds__(128) mvt8_q4_k16(const u8* W, u64 rb, const i8* aq, const float* ad,
                                                              const int* bs, float* out, int n_out, int n_in,
                                                              int n_tok) {
    mvt_q4k<8>(W, rb, aq, ad, bs, out, n_out, n_in, n_tok);
}

extern "C" __global__ void __launch_bounds__(128) mvt16_q4_k16(const u8* W, u64 rb, const i8* aq, const float* ad,
                                                               const int* bs, float* out, int n_out, int n_in,
                                                               int n_tok) {
    mvt_q4k<16>(W, rb, aq, ad, bs, out, n_out, n_in, n_tok);
}

// ---- dequantized weights x f32 activations (exact, F32, F16) -----------

template <class T, int NT>
__device__ __forceinline__ void mm_f(const u8* W, u64 row_bytes, const float* x, float* out,
                                     int n_out, int n_in, int n_tok) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row = blockIdx.x * MM_WARPS + warp;
    if (row >= n_out) return;
    int t0 = blockIdx.y * NT;
    const u8* wr = W + (u64)row * row_bytes;
    int nch = n_in / 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int c = lane; c < nch; c += WARP) {
        float w[32];
        T::deq(wr + (u64)(c / T::NSUB) * T::BYTES, c % T::NSUB, w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int tok = t0 + t;
            if (tok < n_tok) {
                const float4* xp = (const float4*)(x + (u64)tok * n_in + 32 * (u64)c);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 v = xp[i];
                    s += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                }
                acc[t] += s;
            }
        }
    }
    mm_store<NT>(acc, out, row, n_out, t0, n_tok);
}

// F16 weights: mm_f's chunk a lane reads with 2-byte loads 64 bytes
// apart, 16 lines a warp instruction. Here lane l takes the 8-value
// groups l, l + 32, ... of its row with one 16-byte load each (a warp
// reads 512 consecutive bytes), each group's dot in a fixed order and the
// lane's groups in order, whatever NT: mmf1 and mmf8 give the same bits.
// Rows 16-byte aligned (n_in % 8 == 0; bound F16 rows are).
template <int NT>
__device__ __forceinline__ void mm_f16(const u8* W, u64 row_bytes, const float* x, float* out, int n_out,
                                       int n_in, int n_tok) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int row = blockIdx.x * MM_WARPS + warp;
    if (row >= n_out) return;
    int t0 = blockIdx.y * NT;
    const uint4* wr = (const uint4*)(W + (u64)row * row_bytes);
    int ng = n_in / 8;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
#pragma unroll 4
    for (int j = lane; j < ng; j += WARP) {
        uint4 q = wr[j];
        float w[8] = {lo_h(q.x), hi_h(q.x), lo_h(q.y), hi_h(q.y), lo_h(q.z), hi_h(q.z), lo_h(q.w), hi_h(q.w)};
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int tok = t0 + t;
            if (tok < n_tok) {
                const float4* xp = (const float4*)(x + (u64)tok * n_in + 8 * (u64)j);
                float4 v0 = xp[0], v1 = xp[1];
                float s = w[0] * v0.x + w[1] * v0.y + w[2] * v0.z + w[3] * v0.w + w[4] * v1.x + w[5] * v1.y +
                          w[6] * v1.z + w[7] * v1.w;
                acc[t] += s;
            }
        }
    }
    mm_store<NT>(acc, out, row, n_out, t0, n_tok);
}

// ---- tensor cores (sm_80+): batches of tokens, production numerics -----
//
// A warp computes a tile of 16 weight rows x 8 * MMA_TT tokens; per
// 32-value chunk, two int8 mma.m16n8k16 per 8 tokens give the exact
// integer dot of each (row, token) for the chunk's two 16-value halves
// (the halves may have different scales: Q6_K). Integer sums are kept per
// weight block and combined with the CPU's formula when the block ends.
// Fragment layouts (PTX ISA, mma.m16n8k16 .s8): lane = 4 * g + t; A regs
// hold rows g and g + 8, columns 4t..4t+3; B holds column (token) g, rows
// (k) 4t..4t+3; C holds rows g, g + 8 x columns 2t, 2t + 1.
// grid = (ceil(n_out / (16 * MMA_WARPS)), ceil(n_tok / (8 * MMA_TT))).

#define MMA_WARPS 4
#define MMA_TT 4

// What a lane reads for one 32-value chunk: its A fragment words of rows
// g and g + 8, their integer scales, and its B words of every token tile.
// Loaded one chunk ahead of the one being multiplied, so that the loads
// are in flight during the mma work (the chunk loop is latency-bound
// otherwise).
struct MmaFrag {
    int alo[2], ahi[2];
    int s0[2], s1[2], mn[2];
    int blo[MMA_TT], bhi[MMA_TT];
    // Q8_K: the chunk's activation sum of tokens 2t, 2t + 1 of each tile
    // (Min16 formats: its two 16-value sums as i16 halves).
    int bsum[MMA_TT][2];
};

template <class T>
__device__ __forceinline__ void mma_load(const u8* const* wr, const i8* aq, const int* bs, int n_in, int n_tok,
                                         int tok0, int g, int t, int c, MmaFrag& f) {
    int b = c / T::NSUB, sub = c % T::NSUB;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const u8* blk = wr[k] + (u64)b * T::BYTES;
        f.alo[k] = T::word(blk, sub, t);
        f.ahi[k] = T::word(blk, sub, 4 + t);
        T::scales(blk, sub, f.s0[k], f.s1[k], f.mn[k]);
    }
#pragma unroll
    for (int tt = 0; tt < MMA_TT; tt++) {
        int tok_b = tok0 + 8 * tt + g;
        f.blo[tt] = 0;
        f.bhi[tt] = 0;
        if (tok_b < n_tok) {
            const i8* ap = aq + (u64)tok_b * n_in + 32 * (u64)c;
            f.blo[tt] = *(const int*)(ap + 4 * t);
            f.bhi[tt] = *(const int*)(ap + 16 + 4 * t);
        }
        if (T::ACT == 2) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int tok = tok0 + 8 * tt + 2 * t + j;
                const int* bp = bs + (u64)tok * (n_in / 16) + 2 * c;
                int v = Min16<T>::v ? (int)(((u32)bp[0] & 0xffffu) | ((u32)bp[1] << 16)) : bp[0] + bp[1];
                f.bsum[tt][j] = tok < n_tok ? v : 0;
            }
        }
    }
}

template <class T>
__device__ __forceinline__ void mm_mma(const u8* W, u64 row_bytes, const i8* aq, const float* ad,
                                       const float* as, const int* bs, float* out, int n_out,
                                       int n_in, int n_tok) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int g = lane >> 2, t = lane & 3;
    int row0 = (blockIdx.x * MMA_WARPS + warp) * 16;
    if (row0 >= n_out) return;
    int tok0 = blockIdx.y * 8 * MMA_TT;
    int rows[2] = {row0 + g, row0 + g + 8};
    const u8* wr[2];
#pragma unroll
    for (int k = 0; k < 2; k++) wr[k] = W + (u64)min(rows[k], n_out - 1) * row_bytes;
    int nch = n_in / 32, nab = n_in / 32;
    float acc[MMA_TT][4];
    int bi[MMA_TT][4], bm[MMA_TT][4];
#pragma unroll
    for (int tt = 0; tt < MMA_TT; tt++)
#pragma unroll
        for (int k = 0; k < 4; k++) { acc[tt][k] = 0.0f; bi[tt][k] = 0; bm[tt][k] = 0; }
    MmaFrag cur;
    mma_load<T>(wr, aq, bs, n_in, n_tok, tok0, g, t, 0, cur);
    for (int c = 0; c < nch; c++) {
        MmaFrag nxt;
        if (c + 1 < nch) mma_load<T>(wr, aq, bs, n_in, n_tok, tok0, g, t, c + 1, nxt);
        int b = c / T::NSUB;
        bool last = c % T::NSUB == T::NSUB - 1;
#pragma unroll
        for (int tt = 0; tt < MMA_TT; tt++) {
            int tb = tok0 + 8 * tt;
            if (tb >= n_tok) break;  // uniform over the warp
            int clo[4] = {0, 0, 0, 0}, chi[4] = {0, 0, 0, 0};
            mma_s8(clo, cur.alo[0], cur.alo[1], cur.blo[tt]);
            mma_s8(chi, cur.ahi[0], cur.ahi[1], cur.bhi[tt]);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int ri = k >> 1;               // row g or g + 8
                int tok = tb + 2 * t + (k & 1);
                bi[tt][k] += cur.s0[ri] * clo[k] + cur.s1[ri] * chi[k];
                if (T::ACT == 2) {
                    int bv = cur.bsum[tt][k & 1];
                    bm[tt][k] += Min16<T>::v ? chunk_min_term<T>(cur.mn[ri], (int)(short)(bv & 0xffff), bv >> 16)
                                             : cur.mn[ri] * bv;
                }
                if (last) {
                    if (tok < n_tok) {
                        u64 ai = (u64)tok * nab + b;
                        // __fadd_rn: never contracted with combine's product
                        // (matmul_tiled.cu sums the same way).
                        acc[tt][k] = __fadd_rn(acc[tt][k], combine<T>(wr[ri] + (u64)b * T::BYTES, bi[tt][k],
                                                                      bm[tt][k], ad[ai],
                                                                      T::ACT == 1 ? as[ai] : 0.0f));
                    }
                    bi[tt][k] = 0;
                    bm[tt][k] = 0;
                }
            }
        }
        cur = nxt;
    }
#pragma unroll
    for (int tt = 0; tt < MMA_TT; tt++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int row = rows[k >> 1], tok = tok0 + 8 * tt + 2 * t + (k & 1);
            if (row < n_out && tok < n_tok) out[(u64)tok * n_out + row] = acc[tt][k];
        }
}

#define MM_Q(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mv32_##name(MV_PARAMS) {                  \
        MV_PICK                                                                                  \
        mv_q<T, 32>(W, rb, aq, ad, as, bs, out, n_out, n_in, bias, bx);                         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) mv64_##name(MV_PARAMS) {                  \
        MV_PICK                                                                                  \
        mv_q<T, 64>(W, rb, aq, ad, as, bs, out, n_out, n_in, bias, bx);                         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) mv128_##name(MV_PARAMS) {                  \
        MV_PICK                                                                                  \
        mv_q<T, 128>(W, rb, aq, ad, as, bs, out, n_out, n_in, bias, bx);                         \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) mmq8_##name(                             \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,   \
        float* out, int n_out, int n_in, int n_tok) {                                              \
        pdl_wait();                                                                                \
        mm_q<T, 8>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok);                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mma_##name(                              \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,   \
        float* out, int n_out, int n_in, int n_tok) {                                              \
        pdl_wait();                                                                                \
        mm_mma<T>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok);                            \
    }

#define MM_F(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mmf1_##name(                             \
        const u8* W, u64 rb, const float* x, float* out, int n_out, int n_in, int n_tok) {         \
        pdl_wait();                                                                                \
        mm_f<T, 1>(W, rb, x, out, n_out, n_in, n_tok);                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mmf8_##name(                             \
        const u8* W, u64 rb, const float* x, float* out, int n_out, int n_in, int n_tok) {         \
        pdl_wait();                                                                                \
        mm_f<T, 8>(W, rb, x, out, n_out, n_in, n_tok);                                        \
    }

MM_Q(q4_0, TQ4_0)
MM_Q(q4_1, TQ4_1)
MM_Q(q5_0, TQ5_0)
MM_Q(q8_0, TQ8_0)
MM_Q(q4_k, TQ4_K)
MM_Q(q5_k, TQ5_K)
MM_Q(q6_k, TQ6_K)
MM_Q(q2_k, TQ2_K)
MM_Q(iq2_xxs, TIQ2_XXS)

MM_F(f32, TF32)
// F16 rows that are not 16-byte aligned: mm_f (matmul.rs picks).
MM_F(f16u, TF16)
extern "C" __global__ void __launch_bounds__(128) mmf1_f16(const u8* W, u64 rb, const float* x, float* out,
                                                          int n_out, int n_in, int n_tok) {
    pdl_wait();
    mm_f16<1>(W, rb, x, out, n_out, n_in, n_tok);
}
extern "C" __global__ void __launch_bounds__(128) mmf8_f16(const u8* W, u64 rb, const float* x, float* out,
                                                          int n_out, int n_in, int n_tok) {
    pdl_wait();
    mm_f16<8>(W, rb, x, out, n_out, n_in, n_tok);
}
MM_F(q4_0, TQ4_0)
MM_F(q4_1, TQ4_1)
MM_F(q5_0, TQ5_0)
MM_F(q8_0, TQ8_0)
MM_F(q4_k, TQ4_K)
MM_F(q5_k, TQ5_K)
MM_F(q6_k, TQ6_K)
MM_F(q2_k, TQ2_K)
MM_F(iq2_xxs, TIQ2_XXS)
