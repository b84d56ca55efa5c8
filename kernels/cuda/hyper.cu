// Row-wise ops of hyper-connection models (prepended: common.cuh).
// Launched only by kernels/src/cuda/hyper.rs. Each op follows its CPU
// reference (kernels/src/cpu/hyper.rs) operation by operation: f64 where
// the CPU computes in f64, f32 products and sums through __f*_rn where a
// contraction into an FMA would change the bits. (An f64 product of two
// f32 values is exact, so an f64 FMA over such products gives the bits of
// the CPU's separate multiply and add.)

#define HC_MAX 8                          // streams (cpu/hyper.rs MAX_HC)
#define MIX_MAX ((2 + HC_MAX) * HC_MAX)   // values of a row's mix
#define MIX_J 24                          // mix values per hc_mix block (grid.z)
#define MIX_WARPS 8                       // warps of an hc_mix block, two rows each
#define MIX_ROWS (2 * MIX_WARPS)          // rows of an hc_mix block

__device__ __forceinline__ double d_neg_inf() { return __longlong_as_double(0xfff0000000000000ull); }

__device__ __forceinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The sum of a block's values (every thread gets it); blockDim.x a
// multiple of 32, at most 1024.
__device__ __forceinline__ double block_sum_d(double v) {
    __shared__ double part[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    v = warp_sum_d(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    int nw = blockDim.x / 32;
    v = lane < nw ? part[lane] : 0.0;
    v = warp_sum_d(v);
    __syncthreads();  // part may be reused by the caller's next sum
    return v;
}

// `1 / sqrt(ss / n + eps)` as the CPU's norm_into rounds it.
__device__ __forceinline__ float rms_scale(double ss, int n, float eps) {
    return (float)(1.0 / sqrt(ss / (double)n + (double)eps));
}

// ---- hyper-connection pre: norm, mix, split + collapse ------------------
//
// hc_pre runs three kernels: hc_norm (the 1/rms of each row's flattened
// streams), hc_mix (split-K partial dots of the mix weight with the
// normalized rows) and hc_split (partials summed, sigmoid split, Sinkhorn,
// collapse); for few rows right after an hc_post, two: hc_mix_short
// takes the 1/rms from the sums of squares that hc_post left. hc_head
// runs the same with hc_split in head mode.

// One block per row: rs[r] = 1 / sqrt(mean(x[r]^2) + eps), the sum of
// squares in f64. Bound by reading the row (n_hc * d f32).
extern "C" __global__ void hc_norm(const float* x, float* rs, int cols, float eps) {
    pdl_wait();
    const float* xr = x + (u64)blockIdx.x * cols;
    double s = 0.0;
    if (cols % 4 == 0) {
        // 16 bytes a load, a thread's loads in flight together: one
        // block reads the whole row at once (64 KB for 4 x 4096).
        const float4* x4 = (const float4*)xr;
#pragma unroll 8
        for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) {
            float4 v = x4[i];
            s += (double)v.x * (double)v.x;
            s += (double)v.y * (double)v.y;
            s += (double)v.z * (double)v.z;
            s += (double)v.w * (double)v.w;
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            double v = (double)xr[i];
            s += v * v;
        }
    }
    s = block_sum_d(s);
    if (threadIdx.x == 0) rs[blockIdx.x] = rms_scale(s, cols, eps);
}

// Two adjacent columns (2p, 2p + 1) of mix row j, as f32.
__device__ __forceinline__ void mix_pair(const u16* w, u64 row_off, u64 p, float& a, float& b) {
    u32 v = *(const u32*)(w + row_off + 2 * p);
    a = h2f((u16)(v & 0xffffu));
    b = h2f((u16)(v >> 16));
}
__device__ __forceinline__ void mix_pair(const float* w, u64 row_off, u64 p, float& a, float& b) {
    a = w[row_off + 2 * p];
    b = w[row_off + 2 * p + 1];
}

// The activation the CPU's matmul sees: x * rs (norm_into), rounded to
// f16 when the weight's vec_dot_type is F16 (production numerics).
__device__ __forceinline__ float mix_act(float x, float s, int round16) {
    float a = __fmul_rn(x, s);
    return round16 ? h2f(f2h(a)) : a;
}

// One step of a lane's sums: columns k, k + 1 of rows x0 and x1 (zeros
// where there is no second row) times mix rows j0 .. j0 + nj, added into
// acc[row][j] as two FMAs per value. hc_mix and hc_mix_short both sum
// through this, so they give the same bits.
template <class W, int J>
__device__ __forceinline__ void mix_step(const float* x0, const float* x1, bool has1, float s0, float s1,
                                         const W* w, int j0, int nj, int cols, u64 k, int round16,
                                         float (&acc)[2][J]) {
    float2 xa = *(const float2*)(x0 + k);
    float2 xb = has1 ? *(const float2*)(x1 + k) : make_float2(0.0f, 0.0f);
    float a0 = mix_act(xa.x, s0, round16), a1 = mix_act(xa.y, s0, round16);
    float b0 = mix_act(xb.x, s1, round16), b1 = mix_act(xb.y, s1, round16);
#pragma unroll
    for (int j = 0; j < J; j++) {
        if (j < nj) {
            float wa, wb;
            mix_pair(w, (u64)(j0 + j) * cols, k / 2, wa, wb);
            acc[0][j] = fmaf(wb, a1, fmaf(wa, a0, acc[0][j]));
            acc[1][j] = fmaf(wb, b1, fmaf(wa, b0, acc[1][j]));
        }
    }
}

// Split-K partial dots: grid (K chunks, row groups of MIX_ROWS, groups of
// MIX_J mix rows). Warp w takes rows r0 + 2w, r0 + 2w + 1 over the block's
// chunk of `chunk` columns (a multiple of 64), lane l columns 2(l + 32i),
// 2(l + 32i) + 1, with every one of the block's mix rows; the lanes' sums
// are then added in a fixed order through shared memory (a transpose per
// 32 values), so results do not depend on timing.
// part[(chunk_index * rows + row) * nw + j] = sum over the chunk of
// mix[j][k] * act(x[row][k]). Bound by the mix rows (L2: the block's
// 8 warps share its slice through L1) and the x rows (HBM, read once).
template <class W>
__device__ __forceinline__ void hc_mix_impl(const float* x, const float* rs, const W* w, float* part, int rows,
                                            int cols, int nw, int chunk, int round16) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r0 = blockIdx.y * MIX_ROWS + 2 * warp;
    int j0 = blockIdx.z * MIX_J;
    int nj = min(MIX_J, nw - j0);
    u64 k_begin = (u64)blockIdx.x * chunk;
    u64 k_end = min((u64)cols, k_begin + chunk);
    // The weights of this block's slice into L2 while the previous kernel
    // finishes (only when the whole matrix is small, see prefetch_l2).
    u64 total = (u64)nw * cols * sizeof(W);
    for (int j = 0; j < nj; j++)
        prefetch_l2((const u8*)(w + (u64)(j0 + j) * cols + k_begin), (k_end - k_begin) * sizeof(W), total,
                    threadIdx.x, blockDim.x);
    pdl_wait();
    if (r0 >= rows) return;  // whole warp; no block-wide barrier below
    bool has1 = r0 + 1 < rows;
    const float* x0 = x + (u64)r0 * cols;
    const float* x1 = x0 + cols;
    float s0 = rs[r0], s1 = has1 ? rs[r0 + 1] : 0.0f;
    float acc[2][MIX_J];
#pragma unroll
    for (int j = 0; j < MIX_J; j++) acc[0][j] = acc[1][j] = 0.0f;
    for (u64 k = k_begin + 2 * lane; k < k_end; k += 64)
        mix_step(x0, x1, has1, s0, s1, w, j0, nj, cols, k, round16, acc);
    // Lane sums: value f = r * MIX_J + j of every lane, 32 values at a time
    // through a 32 x 33 tile, lane l then adding column l in lane order.
    __shared__ float red[MIX_WARPS][32 * 33];
    float* t = red[warp];
#pragma unroll
    for (int b = 0; b < (2 * MIX_J + 31) / 32; b++) {
#pragma unroll
        for (int i = 0; i < 32; i++) {
            int f = 32 * b + i;
            if (f < 2 * MIX_J) t[lane * 33 + i] = acc[f / MIX_J][f % MIX_J];
        }
        __syncwarp();
        int f = 32 * b + lane;
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s = __fadd_rn(s, t[i * 33 + lane]);
        __syncwarp();
        int r = r0 + f / MIX_J, j = f % MIX_J;
        if (f < 2 * MIX_J && r < rows && j < nj) part[((u64)blockIdx.x * rows + r) * nw + j0 + j] = s;
    }
}

extern "C" __global__ void hc_mix_f16(const float* x, const float* rs, const u16* w, float* part, int rows,
                                      int cols, int nw, int chunk, int round16) {
    hc_mix_impl<u16>(x, rs, w, part, rows, cols, nw, chunk, round16);
}

extern "C" __global__ void hc_mix_f32(const float* x, const float* rs, const float* w, float* part, int rows,
                                      int cols, int nw, int chunk, int round16) {
    hc_mix_impl<float>(x, rs, w, part, rows, cols, nw, chunk, round16);
}

// hc_mix of few rows (chunks of MIX_SHORT columns, the chunk hc_mix takes
// for up to 16 rows), the mix rows split over the warps: grid (K chunks,
// row pairs), warp w takes mix rows MIX_JG w .. MIX_JG (w + 1) of rows
// 2 blockIdx.y and 2 blockIdx.y + 1. Each (row, mix row) value is summed
// as hc_mix sums it (a lane's columns in order, then the lanes in order),
// so both give the same bits; here the block's loads are all in flight at
// once (the chunk's 4 steps unrolled, MIX_JG rows each) and every warp
// has work where hc_mix leaves 7 of 8 idle for one row.
#define MIX_SHORT 256
#define MIX_JG 6
// Row r's 1/rms: rs[r], or from the n_part block sums of squares hc_post
// left at ssp (added in block order) when ssp is set.
__device__ __forceinline__ float row_scale(const float* rs, const double* ssp, int n_part, int r, int cols,
                                           float eps) {
    if (!ssp) return rs[r];
    const double* p = ssp + (u64)r * n_part;
    double s = p[0];
    for (int k = 1; k < n_part; k++) s += p[k];
    return rms_scale(s, cols, eps);
}

template <class W>
__device__ __forceinline__ void hc_mix_short_impl(const float* x, const float* rs, const double* ssp,
                                                  int n_part, float eps, const W* w, float* part,
                                                  int rows, int cols, int nw, int round16) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int r0 = 2 * blockIdx.y;
    int j0 = warp * MIX_JG;
    int nj = min(MIX_JG, nw - j0);
    u64 k_begin = (u64)blockIdx.x * MIX_SHORT;
    u64 k_end = min((u64)cols, k_begin + MIX_SHORT);
    u64 total = (u64)nw * cols * sizeof(W);
    for (int j = 0; j < nj; j++)
        prefetch_l2((const u8*)(w + (u64)(j0 + j) * cols + k_begin), (k_end - k_begin) * sizeof(W), total,
                    lane, 32);
    pdl_wait();
    if (nj <= 0) return;  // whole warp; no block-wide barrier below
    bool has1 = r0 + 1 < rows;
    const float* x0 = x + (u64)r0 * cols;
    const float* x1 = x0 + cols;
    float s0 = row_scale(rs, ssp, n_part, r0, cols, eps);
    float s1 = has1 ? row_scale(rs, ssp, n_part, r0 + 1, cols, eps) : 0.0f;
    float acc[2][MIX_JG];
#pragma unroll
    for (int j = 0; j < MIX_JG; j++) acc[0][j] = acc[1][j] = 0.0f;
#pragma unroll
    for (int it = 0; it < MIX_SHORT / 64; it++) {
        u64 k = k_begin + 64 * it + 2 * lane;
        if (k < k_end) mix_step(x0, x1, has1, s0, s1, w, j0, nj, cols, k, round16, acc);
    }
    // Lane sums: value f = r * MIX_JG + j of every lane through a
    // 32 x (2 MIX_JG + 1) tile, lane f then adding column f in lane order.
    constexpr int F = 2 * MIX_JG, T = F + 1;
    __shared__ float red[(MIX_MAX / MIX_JG + 1) * 32 * T];
    float* t = red + warp * 32 * T;
#pragma unroll
    for (int f = 0; f < F; f++) t[lane * T + f] = acc[f / MIX_JG][f % MIX_JG];
    __syncwarp();
    if (lane < F) {
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) s = __fadd_rn(s, t[i * T + lane]);
        int r = r0 + lane / MIX_JG, j = lane % MIX_JG;
        if (r < rows && j < nj) part[((u64)blockIdx.x * rows + r) * nw + j0 + j] = s;
    }
}

extern "C" __global__ void hc_mix_short_f16(const float* x, const float* rs, const double* ssp, int n_part,
                                            float eps, const u16* w, float* part, int rows, int cols, int nw,
                                            int round16) {
    hc_mix_short_impl<u16>(x, rs, ssp, n_part, eps, w, part, rows, cols, nw, round16);
}

extern "C" __global__ void hc_mix_short_f32(const float* x, const float* rs, const double* ssp, int n_part,
                                            float eps, const float* w, float* part, int rows, int cols, int nw,
                                            int round16) {
    hc_mix_short_impl<float>(x, rs, ssp, n_part, eps, w, part, rows, cols, nw, round16);
}

#define SPLIT_STAGE 2048  // partial sums hc_split stages in shared memory at a time

__device__ __forceinline__ double shfl_d(double v, int src) { return __shfl_sync(FULL_MASK, v, src); }

// The mixing matrix of one row on one warp (n * n <= 32): lane t = a n + b
// returns C[a][b] (the other lanes something finite). The operations, and
// their order, of the block-wide version in hc_split, with the other
// elements read by shuffles instead of through shared memory and barriers.
__device__ double sinkhorn_warp(const float* s_m, const float* scale, const float* base, int n, int steps,
                                double e, int lane) {
    int nn = n * n;
    bool mine = lane < nn;
    int a = mine ? lane / n : 0, b = mine ? lane % n : 0;
    double c = mine ? (double)s_m[2 * n + lane] * (double)scale[2] + (double)base[2 * n + lane] : 0.0;
    double mx = d_neg_inf();
    for (int k = 0; k < n; k++) mx = fmax(mx, shfl_d(c, a * n + k));
    double ex = exp(__dsub_rn(c, mx));
    double s = shfl_d(ex, a * n);
    for (int k = 1; k < n; k++) s = __dadd_rn(s, shfl_d(ex, a * n + k));
    c = __dadd_rn(__ddiv_rn(ex, s), e);
    for (int st = 0; st < steps; st++) {
        if (st % 2 == 0) {  // column
            s = shfl_d(c, b);
            for (int k = 1; k < n; k++) s = __dadd_rn(s, shfl_d(c, k * n + b));
        } else {  // row
            s = shfl_d(c, a * n);
            for (int k = 1; k < n; k++) s = __dadd_rn(s, shfl_d(c, a * n + k));
        }
        c = __ddiv_rn(c, __dadd_rn(s, e));
    }
    return c;
}

// The split's weights from the row's mix m: pre_a = sigmoid(m_a s0 +
// b_a) + eps and post_b = 2 sigmoid(m_{n+b} s1 + b_{n+b}), in f64.
__device__ __forceinline__ float split_pre(const float* m, const float* scale, const float* base, int a,
                                           double e) {
    return (float)(sigmoid_d((double)m[a] * (double)scale[0] + (double)base[a]) + e);
}
__device__ __forceinline__ float split_post(const float* m, const float* scale, const float* base, int n, int b) {
    return (float)(2.0 * sigmoid_d((double)m[n + b] * (double)scale[1] + (double)base[n + b]));
}

// grid (rows, slices of d): the row's mix m (hc_mix's partials summed in
// chunk order), then
//  - head == 0 (hc_pre): pre_a = sigmoid(m_a s0 + b_a) + eps, post_b =
//    2 sigmoid(m_{n+b} s1 + b_{n+b}), C from the logits m_{2n+e} s2 +
//    b_{2n+e} by a row softmax (+ eps), a column normalization and
//    `steps - 1` more normalizations alternating row, column (each sum + eps);
//    block y = 0 computes C and writes split[r] = pre, post, C;
//  - head == 1 (hc_head): the weights pre_a only;
//  - head == 2 (hc_pre with the split on the side stream): block y = 0
//    writes the row's mix m to split[r] (hc_sinkhorn turns it into the
//    split there), and the weights pre_a are computed for the collapse;
// then out[r][i] = sum_a pre_a X_a[i] over the block's slice of d.
// The split runs in f64 like the CPU (the sums in the CPU's order, exact
// division), so its result matches the CPU's bit for bit but for the last
// ulp of a libm exp. Its latency is the f64 Sinkhorn's: with n * n <= 32
// one warp runs it (a lane per element of C) while the block's other
// warps collapse, which needs only pre; larger C take the whole block (a
// thread per element) before the collapse. The partials are staged in
// shared memory first so that their loads are in flight together. The
// collapse is bound by reading the row's n_hc * d values.
extern "C" __global__ void hc_split(const float* x, const float* part, int n_chunks, const float* scale,
                                    const float* base, float* split, float* out, int rows, int n, int d,
                                    int steps, float eps, int head, int slice) {
    pdl_wait();
    __shared__ float s_m[MIX_MAX];
    __shared__ float s_w[MIX_MAX];
    __shared__ float s_stage[SPLIT_STAGE];
    __shared__ double s_c[2][HC_MAX * HC_MAX];
    int r = blockIdx.x, tid = threadIdx.x;
    int nw = head == 1 ? n : (2 + n) * n;
    int tile = SPLIT_STAGE / nw;
    float m = 0.0f;  // thread j < nw: the sum of the chunks so far
    for (int c0 = 0; c0 < n_chunks; c0 += tile) {
        int nc = min(tile, n_chunks - c0);
#pragma unroll 4
        for (int i = tid; i < nc * nw; i += blockDim.x)
            s_stage[i] = part[((u64)(c0 + i / nw) * rows + r) * nw + i % nw];
        __syncthreads();
        if (tid < nw) {
            int c = 0;
            if (c0 == 0) {
                m = s_stage[tid];
                c = 1;
            }
            for (; c < nc; c++) m = __fadd_rn(m, s_stage[c * nw + tid]);
        }
        __syncthreads();
    }
    if (tid < nw) s_m[tid] = m;
    if (head == 2 && blockIdx.y == 0 && tid < nw) split[(u64)r * nw + tid] = m;
    __syncthreads();
    double e = (double)eps;
    if (tid < n) {
        s_w[tid] = split_pre(s_m, scale, base, tid, e);
        if (head == 0) s_w[n + tid] = split_post(s_m, scale, base, n, tid);
    }
    __syncthreads();
    int nn = n * n;
    bool own = !head && blockIdx.y == 0;  // this block computes C and writes the split
    bool warp_c = own && nn <= 32;
    if (warp_c && tid < 32) {
        double c = sinkhorn_warp(s_m, scale, base, n, steps, e, tid);
        if (tid < 2 * n) split[(u64)r * nw + tid] = s_w[tid];
        if (tid < nn) split[(u64)r * nw + 2 * n + tid] = (float)c;
    } else if (own && !warp_c) {  // block-uniform: every thread reaches the barriers
        bool mine = tid < nn;
        int a = mine ? tid / n : 0, b = mine ? tid % n : 0;
        if (mine) s_c[0][tid] = (double)s_m[2 * n + tid] * (double)scale[2] + (double)base[2 * n + tid];
        __syncthreads();
        // Row softmax: max, exp, sum, then v / s + eps.
        if (mine) {
            double mx = d_neg_inf();
            for (int k = 0; k < n; k++) mx = fmax(mx, s_c[0][a * n + k]);
            s_c[1][tid] = exp(__dsub_rn(s_c[0][tid], mx));
        }
        __syncthreads();
        if (mine) {
            double s = s_c[1][a * n];
            for (int k = 1; k < n; k++) s = __dadd_rn(s, s_c[1][a * n + k]);
            s_c[0][tid] = __dadd_rn(__ddiv_rn(s_c[1][tid], s), e);
        }
        __syncthreads();
        int cur = 0;
        for (int st = 0; st < steps; st++) {
            if (mine) {
                const double* c = s_c[cur];
                double s;
                if (st % 2 == 0) {  // column
                    s = c[b];
                    for (int k = 1; k < n; k++) s = __dadd_rn(s, c[k * n + b]);
                } else {  // row
                    s = c[a * n];
                    for (int k = 1; k < n; k++) s = __dadd_rn(s, c[a * n + k]);
                }
                s_c[cur ^ 1][tid] = __ddiv_rn(c[tid], __dadd_rn(s, e));
            }
            __syncthreads();
            cur ^= 1;
        }
        if (mine) s_w[2 * n + tid] = (float)s_c[cur][tid];
        __syncthreads();
        for (int j = tid; j < nw; j += blockDim.x) split[(u64)r * nw + j] = s_w[j];
    }
    // The collapse, by the threads not running the warp's Sinkhorn.
    int first = warp_c ? 32 : 0;
    if (tid < first) return;
    const float* xr = x + (u64)r * n * d;
    int i_end = min(d, (int)(blockIdx.y + 1) * slice);
    for (int i = blockIdx.y * slice + tid - first; i < i_end; i += blockDim.x - first) {
        double acc = (double)s_w[0] * (double)xr[i];
        for (int k = 1; k < n; k++) acc += (double)s_w[k] * (double)xr[(u64)k * d + i];
        out[(u64)r * d + i] = (float)acc;
    }
}

// hc_pre's split off the collapse's path (hyper.rs runs it on the side
// stream): one warp per row turns the row's mix m, which hc_split (head
// == 2) left in split[r], into split[r] = pre, post, C with hc_split's
// operations (n * n <= 32: sinkhorn_warp), so the same bits.
extern "C" __global__ void hc_sinkhorn(const float* scale, const float* base, float* split, int n, int steps,
                                       float eps) {
    pdl_wait();
    __shared__ float s_m[MIX_MAX];
    int r = blockIdx.x, lane = threadIdx.x, nw = (2 + n) * n;
    float* sp = split + (u64)r * nw;
    for (int j = lane; j < nw; j += WARP) s_m[j] = sp[j];
    __syncwarp();
    double e = (double)eps;
    double c = sinkhorn_warp(s_m, scale, base, n, steps, e, lane);
    if (lane < n) {
        sp[lane] = split_pre(s_m, scale, base, lane, e);
        sp[n + lane] = split_post(s_m, scale, base, n, lane);
    }
    if (lane < n * n) sp[2 * n + lane] = (float)c;
}

// X'_b = post_b y + sum_a C[a][b] X_a in place, in f64 like the CPU (exact
// products, so the same bits). grid (rows, ceil(d / blockDim)), a thread
// per (row, i). Bound by memory: n_hc * d values read and written, d read.
// Two fusions the host patches in (hyper.rs):
//  - y2 (else null): the residual add recorded before, y += y2, done here
//    (y is written back, the same f32 add);
//  - ssp (else null): each block's f64 sum of squares of the values it
//    wrote, ssp[r * gridDim.y + blockIdx.y], which hc_mix_short adds in
//    block order for the next hc_pre's 1/rms instead of an hc_norm launch.
extern "C" __global__ void hc_post(float* x, float* y, const float* y2, const float* split, int n, int d,
                                   double* ssp) {
    pdl_wait();
    __shared__ float s_sp[MIX_MAX];
    int r = blockIdx.x, nw = (2 + n) * n;
    for (int j = threadIdx.x; j < nw; j += blockDim.x) s_sp[j] = split[(u64)r * nw + j];
    __syncthreads();
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    double ss = 0.0;
    if (i < d) {
        float* xr = x + (u64)r * n * d;
        double old[HC_MAX];
#pragma unroll
        for (int a = 0; a < HC_MAX; a++) old[a] = a < n ? (double)xr[(u64)a * d + i] : 0.0;
        float yf = y[(u64)r * d + i];
        if (y2) {
            yf = __fadd_rn(yf, y2[(u64)r * d + i]);
            y[(u64)r * d + i] = yf;
        }
        double yv = (double)yf;
        const float* post = s_sp + n;
        const float* comb = s_sp + 2 * n;
#pragma unroll
        for (int b = 0; b < HC_MAX; b++) {
            if (b >= n) break;
            double mixed = (double)comb[b] * old[0];
#pragma unroll
            for (int a = 1; a < HC_MAX; a++)
                if (a < n) mixed += (double)comb[a * n + b] * old[a];
            float v = (float)((double)post[b] * yv + mixed);
            xr[(u64)b * d + i] = v;
            ss += (double)v * (double)v;
        }
    }
    if (ssp) {  // block-uniform
        ss = block_sum_d(ss);
        if (threadIdx.x == 0) ssp[(u64)r * gridDim.y + blockIdx.y] = ss;
    }
}

// ---- heads: RMSNorm, tail RoPE ------------------------------------------

// A warp per head of head_dim values (8 per block): x / sqrt(mean(x^2) +
// eps), the sum of squares in f64. Bound by memory (each value read twice,
// the second time from L1, and written once).
extern "C" __global__ void rms_norm_heads(float* x, u64 n_heads, int head_dim, float eps) {
    pdl_wait();
    u64 h = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (h >= n_heads) return;
    int lane = threadIdx.x % 32;
    float* p = x + h * head_dim;
    double s = 0.0;
    for (int i = lane; i < head_dim; i += 32) {
        double v = (double)p[i];
        s += v * v;
    }
    float sc = rms_scale(warp_sum_d(s), head_dim, eps);
    for (int i = lane; i < head_dim; i += 32) p[i] = __fmul_rn(p[i], sc);
}

// grid (rows, groups of heads_per_block heads): the block's row angles
// phi_k = (+-pos) omega_k, their cosine and sine in f64 (shared memory),
// then a thread per (head, pair) rotating the adjacent pair at
// head_dim - 2 n_pairs + 2k like the CPU (f64 products and difference,
// rounded to f32). Bound by the tail values moved (the sincos are
// n_pairs per block).
extern "C" __global__ void rope_tail(float* x, const u32* pos, const double* omega, int cols, int head_dim,
                                     int n_pairs, int heads_per_block, int inverse) {
    pdl_wait();
    extern __shared__ double cs[];  // cos, sin of pair k at 2k, 2k + 1
    int r = blockIdx.x;
    double p = (double)pos[r];
    if (inverse) p = -p;
    for (int k = threadIdx.x; k < n_pairs; k += blockDim.x) {
        double s, c;
        sincos(p * omega[k], &s, &c);
        cs[2 * k] = c;
        cs[2 * k + 1] = s;
    }
    __syncthreads();
    int heads = cols / head_dim;
    int h0 = blockIdx.y * heads_per_block;
    int n = (min(heads, h0 + heads_per_block) - h0) * n_pairs;
    float* row = x + (u64)r * cols;
    int start = head_dim - 2 * n_pairs;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        int h = h0 + t / n_pairs, k = t % n_pairs;
        float* e = row + (u64)h * head_dim + start + 2 * k;
        double a = (double)e[0], b = (double)e[1];
        double c = cs[2 * k], s = cs[2 * k + 1];
        e[0] = (float)__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s));
        e[1] = (float)__dadd_rn(__dmul_rn(a, s), __dmul_rn(b, c));
    }
}

// ---- the reference engine's activation roundings ------------------------

// 2^ceil(log2(amax / top)), the CPU's block_scale: q = amax / top in f64
// is f * 2^k with f in [0.5, 1); q is a power of two exactly when f = 0.5.
// (amax is an f32 and top 448 = 7 * 64 or 6 = 3 * 2, so a q that is not a
// power of two is at least ~1e-8 (relative) away from one: the CPU's f64
// log2 cannot round it onto an integer, and both give the same exponent.)
__device__ __forceinline__ float pow2_scale(float amax, float top) {
    int k;
    double f = frexp((double)amax / (double)top, &k);
    int e = f == 0.5 ? k - 1 : k;
    return (float)ldexp(1.0, e);
}

// Nearest value of a minifloat with `mbits` mantissa bits and smallest
// normal exponent `emin` (subnormal quantum 2^(emin - mbits)), ties to the
// even code: for 0 <= a <= the format's largest value. The quantum of a's
// binade is a power of two, so a / q is exact and rintf (ties to even)
// picks the even mantissa, which is the even code (E4M3: mbits 3, emin -6;
// E2M1: mbits 1, emin 0). This is the CPU's nearest-grid-value rule.
__device__ __forceinline__ float round_mini(float a, int mbits, int emin) {
    int e = a >= __int_as_float((emin + 127) << 23) ? ((__float_as_int(a) >> 23) & 0xff) - 127 : emin;
    float q = __int_as_float((e - mbits + 127) << 23);
    return __fmul_rn(rintf(__fdiv_rn(a, q)), q);
}

// One value of a block with scale s: (v / s) clamped to +-top, rounded to
// the format, scaled back.
__device__ __forceinline__ float sim_value(float v, float s, float top, int mbits, int emin) {
    float q = fminf(fmaxf(__fdiv_rn(v, s), -top), top);
    return __fmul_rn(copysignf(round_mini(fabsf(q), mbits, emin), q), s);
}

// FP8 E4M3 of K/V rows: a warp per block of 64 values (8 per thread
// block); block g is block g % nb of piece g / nb (pieces of `width`
// values, the first n_round of each rounded, the last block of a piece
// possibly short). Bound by memory.
extern "C" __global__ void round_fp8(float* x, u64 n_blocks, int width, int n_round, int nb) {
    pdl_wait();
    u64 g = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= n_blocks) return;
    int lane = threadIdx.x % 32;
    int blk = (int)(g % nb);
    float* v = x + (g / nb) * width + 64 * blk;
    int len = min(64, n_round - 64 * blk);
    float v0 = lane < len ? v[lane] : 0.0f;
    float v1 = lane + 32 < len ? v[lane + 32] : 0.0f;
    float amax = fmaxf(warp_max(fmaxf(fabsf(v0), fabsf(v1))), 1e-4f);
    float s = pow2_scale(amax, 448.0f);
    if (lane < len) v[lane] = sim_value(v0, s, 448.0f, 3, -6);
    if (lane + 32 < len) v[lane + 32] = sim_value(v1, s, 448.0f, 3, -6);
}

// The indexer's rounding: a warp per head of `dim` (a power of two) values
// in shared memory: the Walsh-Hadamard butterflies stage by stage (pairs
// (j, j + s), a + b and a - b, as the CPU orders them), times `norm`
// (1 / sqrt(dim) as the host rounds it), then FP4 E2M1 of each 32 values
// with scale 2^ceil(log2(amax / 6)), amax >= 6 * 2^-126. Bound by memory.
extern "C" __global__ void round_indexer(float* x, u64 n_heads, int dim, float norm) {
    pdl_wait();
    extern __shared__ float sh[];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u64 h = (u64)blockIdx.x * (blockDim.x / 32) + warp;
    if (h >= n_heads) return;  // whole warp; only warp barriers below
    float* v = sh + (u64)warp * dim;
    float* g = x + h * dim;
    for (int i = lane; i < dim; i += 32) v[i] = g[i];
    __syncwarp();
    for (int s = 1; s < dim; s <<= 1) {
        for (int p = lane; p < dim / 2; p += 32) {
            int j = (p / s) * 2 * s + p % s;
            float a = v[j], b = v[j + s];
            v[j] = __fadd_rn(a, b);
            v[j + s] = __fsub_rn(a, b);
        }
        __syncwarp();
    }
    const float min_amax = 6.0f * __int_as_float(1 << 23);  // 6 * 2^-126
    for (int c = 0; c < dim; c += 32) {
        bool in = c + lane < dim;
        float val = in ? __fmul_rn(v[c + lane], norm) : 0.0f;
        float amax = fmaxf(warp_max(fabsf(val)), min_amax);
        float s = pow2_scale(amax, 6.0f);
        if (in) g[c + lane] = sim_value(val, s, 6.0f, 1, 0);
    }
}

// ---- element-wise -------------------------------------------------------

// out[r] = n_hc copies of x[r] (the streams at the start). Bound by memory.
extern "C" __global__ void hc_expand(const float* x, float* out, u64 rows, int d, int n_hc) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 total = rows * (u64)n_hc * (u64)d;
    if (i >= total) return;
    u64 r = i / ((u64)n_hc * d);
    u64 c = i % (u64)d;
    out[i] = x[r * d + c];
}

extern "C" __global__ void round_f16_inplace(float* x, u64 n) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = h2f(f2h(x[i]));
}

extern "C" __global__ void scale_inplace(float* x, u64 n, float s) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fmul_rn(x[i], s);
}

// silu(min(g, c)) * clamp(u, -c, c) in f64 like the CPU. Bound by memory.
extern "C" __global__ void swiglu_clamped(const float* g, const float* u, float* out, u64 n, float c) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    double gc = (double)fminf(g[i], c);
    double uc = (double)fminf(fmaxf(u[i], -c), c);
    out[i] = (float)__dmul_rn(__ddiv_rn(gc, __dadd_rn(1.0, exp(-gc))), uc);
}
