// Routed mixtures of experts and grouped projections (prepended:
// common.cuh, quant.cuh, iq2.cuh). Launched only by
// kernels/src/cuda/moe.rs; the tensor-core GEMM over gathered rows that
// prefill uses is matmul_tiled.cu's (mmg*, mmgu*), launched through
// matmul.rs.
//
// moe_experts runs as: moe_plan (the (row, slot) entries sorted by
// expert, and tiles of at most BN entries of one expert), the gate and up
// projections of every tile with the clamped SwiGLU and route weight
// (h[p], one row per entry position p), h quantized, the down projection
// (y[p]), then moe_reduce (out[r] = the row's y summed in ascending
// expert order, as the CPU adds them). A tile names its positions p =
// first + t * stride, t < cnt, and the activation row of each (src[p] /
// div, or p without src); grouped projections use the same kernels with
// host-made tiles (group g: rows r at p = r * groups + g).
//
// Numerics. Production (quantized weights): integer block dots of the
// weight with the activation quantized to its vec_dot type, each block's
// float term by T::combine_h (the CPU's formula), the terms of a row
// added in block order. The tensor-core GEMM computes the same integers
// and adds the same terms in the same order, so an entry's result is the
// same bits whichever path its batch takes. Exact numerics (and float
// weights): weights dequantized (T::deq), f32 dots, the same kernel for
// every batch size.
//
// The matvecs (moe_mv*, moe_f*) are bound by weight bytes (decode: a few
// entries per expert): a block takes nr weight rows of one expert (gate
// and up rows alternate in the SwiGLU kernels) and the tile's entries;
// the lanes of a warp read consecutive 32-value chunks of a row (a
// K-quant super-block is 8 lanes), once for all of the tile's entries,
// and each block's term per entry goes to shared memory; then one thread
// per (output, entry) adds the terms in block order. grid = (output
// blocks, tile bound), 128 threads.

#define MV_NT 8        // tokens per matvec tile (moe.rs MV_TOKENS)
#define MAX_K 16       // slots per row moe_reduce orders (moe.rs)
#define PLAN_WARPS 8   // moe_plan: one block of 8 warps

// Every kernel's dynamic shared memory (one declaration for the file).
extern __shared__ __align__(16) u8 moe_smem[];

// ---- routing ---------------------------------------------------------------

// ds4's softplus (x above 20, e^x below -20).
__device__ __forceinline__ double softplus_d(double x) {
    return x > 20.0 ? x : (x < -20.0 ? exp(x) : log1p(exp(x)));
}

// One warp per row (4 rows per 128-thread block), f64 like the CPU
// (latency-bound: k rounds of a warp argmax over n_expert scores):
// pi_e = sqrt(softplus(logit_e)) in shared memory (n_expert doubles per
// warp); experts from the hash table row of tokens[r] or k rounds of a
// warp argmax of pi_e + bias_e over the experts not chosen yet (ties to
// the lower index; lane l tracks experts l + 32 i in bit i of a mask, so
// n_expert <= 1024); weights scale * pi_e / max(sum of chosen pi,
// 6.103515625e-5), the sum taken in chosen order. Lane i writes slot i
// (k <= 32). A hash id outside 0 .. n_expert (the CPU refuses the table)
// is written as it is with weight 0; moe_plan skips it.
extern "C" __global__ void __launch_bounds__(128) moe_route(const float* logits, const float* bias,
                                                           const int* hash, const u32* tokens, float* ids,
                                                           float* wts, int rows, int n_expert, int k,
                                                           float scale) {
    u8* smem = moe_smem;
    pdl_wait();
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int r = blockIdx.x * 4 + warp;
    if (r >= rows) return;  // the whole warp; no block barrier follows
    double* pi = (double*)smem + warp * n_expert;
    const float* lr = logits + (u64)r * n_expert;
    for (int e = lane; e < n_expert; e += WARP) pi[e] = sqrt(softplus_d((double)lr[e]));
    __syncwarp();
    int mine = -1;  // lane i < k: the expert of slot i
    if (hash) {
        if (lane < k) mine = hash[(u64)tokens[r] * k + lane];
    } else {
        u32 taken = 0;
        for (int i = 0; i < k; i++) {
            const int NONE = 0x7fffffff;
            double best = 0.0;
            int at = NONE;
            for (int e = lane, bit = 0; e < n_expert; e += WARP, bit++) {
                if ((taken >> bit) & 1) continue;
                double s = bias ? pi[e] + (double)bias[e] : pi[e];
                if (at == NONE || s > best) {
                    best = s;
                    at = e;
                }
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                double s2 = __shfl_xor_sync(FULL_MASK, best, o);
                int e2 = __shfl_xor_sync(FULL_MASK, at, o);
                if (e2 != NONE && (at == NONE || s2 > best || (s2 == best && e2 < at))) {
                    best = s2;
                    at = e2;
                }
            }
            if (lane == at % WARP) taken |= 1u << (at / WARP);
            if (lane == i) mine = at;
        }
    }
    double sum = 0.0;
    for (int i = 0; i < k; i++) {
        int e = __shfl_sync(FULL_MASK, mine, i);
        if (e >= 0 && e < n_expert) sum += pi[e];
    }
    double den = fmax(sum, 6.103515625e-5);
    if (lane < k) {
        bool ok = mine >= 0 && mine < n_expert;
        ids[(u64)r * k + lane] = (float)mine;
        wts[(u64)r * k + lane] = ok ? (float)((double)scale * pi[mine] / den) : 0.0f;
    }
}

// ---- the plan of moe_experts -------------------------------------------

// One block of PLAN_WARPS warps over the n = rows * k entries of ids
// (entry j: row j / k, slot j % k). Entries whose id is not an expert
// (outside 0 .. n_expert) get pos[j] = -1 and no position. The others are
// sorted by expert, stably: position pos[j] = p and ent[p] = j, expert e
// at off[e] .. off[e] + count[e]. Warp w counts its contiguous segment of
// entries per expert (__match_any_sync groups a step's equal ids), the
// counts become per-(warp, expert) bases and per-expert offsets (a block
// scan), and each warp walks its segment again handing out positions.
// One block suffices: the work is two passes over n entries (32 a warp
// step) and a scan over n_expert, a few microseconds for 2048 rows x 6.
// Tiles: for each of the two capacities bn_a, bn_b, expert e's positions
// in runs of at most bn: (e, first, cnt, 0), experts in order; the
// counts in n_tiles[0], n_tiles[1]. Shared memory: counts [PLAN_WARPS][E]
// and offsets [E] (i32).
extern "C" __global__ void __launch_bounds__(PLAN_WARPS * WARP)
    moe_plan(const float* ids, int n, int n_expert, int bn_a, int bn_b, int* ent, int* pos, int4* tiles_a,
             int4* tiles_b, int* n_tiles) {
    u8* smem = moe_smem;
    __shared__ int wsum[PLAN_WARPS][3];
    pdl_wait();
    int* wc = (int*)smem;             // [PLAN_WARPS][n_expert]
    int* off = wc + PLAN_WARPS * n_expert;
    const int NTH = PLAN_WARPS * WARP;
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int seg = (n + PLAN_WARPS - 1) / PLAN_WARPS;
    int s0 = min(n, warp * seg), s1 = min(n, s0 + seg);
    for (int i = threadIdx.x; i < PLAN_WARPS * n_expert; i += NTH) wc[i] = 0;
    __syncthreads();
    for (int base = s0; base < s1; base += WARP) {
        int j = base + lane, e = -1;
        if (j < s1) {
            float v = ids[j];
            if (v >= 0.0f && v < (float)n_expert) e = (int)v;
        }
        u32 peers = __match_any_sync(FULL_MASK, e);
        if (e >= 0 && lane == __ffs(peers) - 1) wc[warp * n_expert + e] += __popc(peers);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += NTH) {
        int run = 0;
        for (int w = 0; w < PLAN_WARPS; w++) {
            int c = wc[w * n_expert + e];
            wc[w * n_expert + e] = run;
            run += c;
        }
        off[e] = run;  // the count, for now
    }
    __syncthreads();
    // Exclusive scan over experts of (count, tiles of bn_a, tiles of bn_b):
    // thread i takes experts per * i .. per * (i + 1).
    int per = (n_expert + NTH - 1) / NTH;
    int e0 = min(n_expert, threadIdx.x * per), e1 = min(n_expert, e0 + per);
    int lc = 0, la = 0, lb = 0;
    for (int e = e0; e < e1; e++) {
        int c = off[e];
        lc += c;
        la += (c + bn_a - 1) / bn_a;
        lb += (c + bn_b - 1) / bn_b;
    }
    int ic = lc, ia = la, ib = lb;
#pragma unroll
    for (int o = 1; o < WARP; o <<= 1) {
        int yc = __shfl_up_sync(FULL_MASK, ic, o), ya = __shfl_up_sync(FULL_MASK, ia, o),
            yb = __shfl_up_sync(FULL_MASK, ib, o);
        if (lane >= o) {
            ic += yc;
            ia += ya;
            ib += yb;
        }
    }
    if (lane == WARP - 1) {
        wsum[warp][0] = ic;
        wsum[warp][1] = ia;
        wsum[warp][2] = ib;
    }
    __syncthreads();
    int bc = ic - lc, ba = ia - la, bb = ib - lb;
    for (int w = 0; w < warp; w++) {
        bc += wsum[w][0];
        ba += wsum[w][1];
        bb += wsum[w][2];
    }
    for (int e = e0; e < e1; e++) {
        int c = off[e];
        off[e] = bc;
        for (int q = 0; q * bn_a < c; q++) tiles_a[ba++] = make_int4(e, bc + q * bn_a, min(bn_a, c - q * bn_a), 0);
        for (int q = 0; q * bn_b < c; q++) tiles_b[bb++] = make_int4(e, bc + q * bn_b, min(bn_b, c - q * bn_b), 0);
        bc += c;
    }
    if (threadIdx.x == NTH - 1) {
        n_tiles[0] = ba;
        n_tiles[1] = bb;
    }
    __syncthreads();
    for (int base = s0; base < s1; base += WARP) {
        int j = base + lane, e = -1;
        if (j < s1) {
            float v = ids[j];
            if (v >= 0.0f && v < (float)n_expert) e = (int)v;
        }
        u32 peers = __match_any_sync(FULL_MASK, e);
        if (e >= 0) {
            int p = off[e] + wc[warp * n_expert + e] + __popc(peers & ((1u << lane) - 1));
            ent[p] = j;
            pos[j] = p;
        } else if (j < s1) {
            pos[j] = -1;
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(peers) - 1) wc[warp * n_expert + e] += __popc(peers);
        __syncwarp();
    }
}

// ---- matvecs over tiles ----------------------------------------------------

// What every matvec block reads first: its tile (blocks past n_tiles
// return false, the whole block) and the tile's activation rows (arow).
__device__ __forceinline__ bool mv_tile(const int4* tiles, const int* n_tiles, const int* src, int div,
                                        int stride, int* arow, int4& tile) {
    if ((int)blockIdx.y >= *n_tiles) return false;
    tile = tiles[blockIdx.y];
    if ((int)threadIdx.x < tile.z) {
        int p = tile.y + (int)threadIdx.x * stride;
        arow[threadIdx.x] = src ? src[p] / div : p;
    }
    __syncthreads();
    return true;
}

// The weight block b of block row r: rows row0 + r (GU: gate row
// row0 + r / 2 for even r, up for odd) of expert e; null past n_out.
template <bool GU>
__device__ __forceinline__ const u8* mv_row(const u8* W0, const u8* W1, u64 rb, int n_out, int e, int row0,
                                            int r) {
    int j = row0 + (GU ? r >> 1 : r);
    if (j >= n_out) return nullptr;
    return (GU && (r & 1) ? W1 : W0) + ((u64)e * n_out + j) * rb;
}

// Each (output, token) of the tile: its row's block terms (part[row][t][b])
// added in block order; GU: the clamped SwiGLU of the gate and up sums
// times the entry's route weight.
template <bool GU>
__device__ __forceinline__ void mv_store(const float* part, int nb, int nr, int4 tile, int stride, int row0,
                                         int n_out, const int* src, float* out, const float* wts, float clamp) {
    int nj = GU ? nr / 2 : nr, cnt = tile.z;
    for (int it = threadIdx.x; it < nj * cnt; it += blockDim.x) {
        int jl = it / cnt, t = it % cnt;
        int j = row0 + jl;
        if (j >= n_out) continue;
        u64 p = (u64)(tile.y + t * stride);
        const float* pa = part + ((GU ? 2 * jl : jl) * MV_NT + t) * nb;
        float a = 0.0f;
        for (int b = 0; b < nb; b++) a = __fadd_rn(a, pa[b]);
        if (GU) {
            const float* pu = pa + MV_NT * nb;
            float u = 0.0f;
            for (int b = 0; b < nb; b++) u = __fadd_rn(u, pu[b]);
            out[p * n_out + j] = swiglu_clamped_w(a, u, clamp, wts[src[p]]);
        } else {
            out[p * n_out + j] = a;
        }
    }
}

// matmul.cu's chunk_dot: the integer dot of one weight chunk with 32
// activation quants at a (16-byte aligned), scaled per 16-value half;
// for Q8_K activations the chunk's min term from its two 16-value sums.
template <class T>
__device__ __forceinline__ void mv_chunk_dot(const int* q, int s0, int s1, int m, const i8* a, const int* bsp,
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
    summs = T::ACT == 2 && HasMin<T>::v ? chunk_min_term<T>(m, bsp[0], bsp[1]) : 0;
}

// The weight blocks a matvec block computes: items it = (row r, block b)
// of nr rows x nb blocks, each taken by L = T::NSUB lanes (one 32-value
// chunk each, so that a warp reads 32 / L consecutive blocks of a row at
// once), U items a lane group per step. Every lane of a warp runs the
// same steps (a block's chunk sums are added over its lanes with
// shuffles); `ok` is false past the items or the rows.
#define MV_ITEMS_LOOP(L, U)                                                                        \
    int lane = threadIdx.x % WARP, sub = lane % (L);                                               \
    int per_warp = (U) * (WARP / (L)), n_items = nr * nb;                                          \
    for (int base = (threadIdx.x / WARP) * per_warp; base < n_items;                               \
         base += (blockDim.x / WARP) * per_warp)
#define MV_U 4  // items a lane group loads before using any (bytes in flight)

// Production: quantized weights x quantized activations (aq, ad, as, bs
// in matmul.cu's layout, rows of n_in). Each block's integer sums are
// exact (dp4a per chunk, added over the block's lanes), its term is
// T::combine_h. Shared memory: arow [MV_NT] i32, part [nr][MV_NT][nb] f32
// (nb = blocks per row).
template <class T, bool GU>
__device__ __forceinline__ void moe_mv(const u8* W0, const u8* W1, u64 rb, int n_out, int n_in, int nr,
                                       const int4* tiles, const int* n_tiles, const int* src, int div, int stride,
                                       const i8* aq, const float* ad, const float* as, const int* bs, float* out,
                                       const float* wts, float clamp) {
    u8* smem = moe_smem;
    int* arow = (int*)smem;
    float* part = (float*)(smem + 4 * MV_NT);
    pdl_wait();
    int4 tile;
    if (!mv_tile(tiles, n_tiles, src, div, stride, arow, tile)) return;
    int cnt = tile.z, nb = n_in / (32 * T::NSUB);
    int row0 = blockIdx.x * (GU ? nr / 2 : nr);
    u64 nab = n_in / 32, nbs = n_in / 16;
    MV_ITEMS_LOOP(T::NSUB, MV_U) {
        int q[MV_U][8], s0[MV_U], s1[MV_U], m[MV_U], it[MV_U];
        u32 h[MV_U];
        bool ok[MV_U];
#pragma unroll
        for (int u = 0; u < MV_U; u++) {
            it[u] = base + u * (WARP / T::NSUB) + lane / T::NSUB;
            int r = it[u] / nb, b = it[u] % nb;
            const u8* wr = it[u] < n_items ? mv_row<GU>(W0, W1, rb, n_out, tile.x, row0, r) : nullptr;
            ok[u] = wr != nullptr;
            const u8* blk = ok[u] ? wr + (u64)b * T::BYTES : W0;
            s0[u] = 0;
            s1[u] = 0;
            m[u] = 0;
            h[u] = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) q[u][i] = 0;
            if (ok[u]) {
                load_chunk<T>(blk, sub, q[u], s0[u], s1[u], m[u]);
                if (sub == 0) h[u] = T::hdr(blk);
            }
        }
#pragma unroll
        for (int t = 0; t < MV_NT; t++) {
            if (t >= cnt) break;  // uniform over the block
            const i8* at = aq + (u64)arow[t] * n_in;
            const int* bt = bs + (u64)arow[t] * nbs;
#pragma unroll
            for (int u = 0; u < MV_U; u++) {
                int b = it[u] % nb;
                u64 ch = (u64)b * T::NSUB + sub;
                int is = 0, sm = 0;
                if (ok[u]) mv_chunk_dot<T>(q[u], s0[u], s1[u], m[u], at + 32 * ch, bt + 2 * ch, is, sm);
#pragma unroll
                for (int o = T::NSUB / 2; o > 0; o >>= 1) {
                    is += __shfl_xor_sync(FULL_MASK, is, o);
                    if (HasMin<T>::v) sm += __shfl_xor_sync(FULL_MASK, sm, o);
                }
                if (ok[u] && sub == 0) {
                    u64 ai = (u64)arow[t] * nab + b;
                    part[((it[u] / nb) * MV_NT + t) * nb + b] =
                        T::combine_h(h[u], is, sm, ad[ai], T::ACT == 1 ? as[ai] : 0.0f);
                }
            }
        }
    }
    __syncthreads();
    mv_store<GU>(part, nb, nr, tile, stride, row0, n_out, src, out, wts, clamp);
}

// Exact numerics and float weights: chunks dequantized (T::deq), f32 dots
// with the activation rows x (rounded to f16 first when round16: F16
// weights in production numerics, as the CPU rounds their input), each
// block's chunk sums added over its lanes in a fixed tree.
template <class T, bool GU>
__device__ __forceinline__ void moe_f(const u8* W0, const u8* W1, u64 rb, int n_out, int n_in, int nr,
                                      const int4* tiles, const int* n_tiles, const int* src, int div, int stride,
                                      const float* x, int round16, float* out, const float* wts, float clamp) {
    u8* smem = moe_smem;
    int* arow = (int*)smem;
    float* part = (float*)(smem + 4 * MV_NT);
    pdl_wait();
    int4 tile;
    if (!mv_tile(tiles, n_tiles, src, div, stride, arow, tile)) return;
    int cnt = tile.z, nb = n_in / (32 * T::NSUB);
    int row0 = blockIdx.x * (GU ? nr / 2 : nr);
    MV_ITEMS_LOOP(T::NSUB, 1) {
        int it = base + lane / T::NSUB;
        int r = it / nb, b = it % nb;
        const u8* wr = it < n_items ? mv_row<GU>(W0, W1, rb, n_out, tile.x, row0, r) : nullptr;
        bool ok = wr != nullptr;
        float w[32];
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = 0.0f;
        if (ok) T::deq(wr + (u64)b * T::BYTES, sub, w);
        u64 ch = (u64)b * T::NSUB + sub;
#pragma unroll
        for (int t = 0; t < MV_NT; t++) {
            if (t >= cnt) break;  // uniform over the block
            float s = 0.0f;
            if (ok) {
                const float4* xp = (const float4*)(x + (u64)arow[t] * n_in + 32 * ch);
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 v = xp[i];
                    if (round16) {
                        v.x = h2f(f2h(v.x));
                        v.y = h2f(f2h(v.y));
                        v.z = h2f(f2h(v.z));
                        v.w = h2f(f2h(v.w));
                    }
                    s += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                }
            }
#pragma unroll
            for (int o = T::NSUB / 2; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
            if (ok && sub == 0) part[(r * MV_NT + t) * nb + b] = s;
        }
    }
    __syncthreads();
    mv_store<GU>(part, nb, nr, tile, stride, row0, n_out, src, out, wts, clamp);
}

// ---- one warp per output row (decode) --------------------------------------

// One weight chunk a lane holds while the warp's other loads are in
// flight; expand() gives load_chunk's words and scales, hdr its block's
// T::hdr. Default: the expanded chunk itself; IQ2_XXS keeps its two raw
// words (3 registers instead of 12) and expands them when used.
template <class T>
struct DvChunk {
    int q[8], s0, s1, m;
    u32 h;
    __device__ __forceinline__ void load(const u8* blk, int sub) {
        load_chunk<T>(blk, sub, q, s0, s1, m);
        h = T::hdr(blk);
    }
    __device__ __forceinline__ void clear() {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = 0;
        s0 = s1 = m = 0;
        h = 0;
    }
    __device__ __forceinline__ void expand(int* w, int& a, int& b, int& c) const {
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = q[i];
        a = s0;
        b = s1;
        c = m;
    }
};
template <>
struct DvChunk<TIQ2_XXS> {
    u32 a, s, h;
    __device__ __forceinline__ void load(const u8* blk, int sub) {
        const u8* g = blk + 2 + 8 * sub;
        a = ld32_2(g);
        s = ld32_2(g + 4);
        h = TIQ2_XXS::hdr(blk);
    }
    __device__ __forceinline__ void clear() { a = s = h = 0; }
    __device__ __forceinline__ void expand(int* w, int& s0, int& s1, int& m) const {
        iq2_expand(a, s, w, s0, s1, m);
    }
};
// Chunks a lane loads before using any: a whole IQ2_XXS gate and up row
// pair of 4096 values at once.
template <class T> struct DvU { static constexpr int v = 4; };
template <> struct DvU<TIQ2_XXS> { static constexpr int v = 8; };

#define DV_WARPS 4  // rows (GU: gate and up row pairs) per block (moe.rs DV_ROWS)

// Production numerics, the tiles' entries (at most MV_NT) through one
// output row j a warp (GU: gate row j of W0 and up row j of W1): lane l
// takes chunks l, l + 32, ... of the row, all of a step's loads issued
// before any is used; a block's integer sums are added over its NSUB
// lanes with shuffles (exact), its term is T::combine_h, and the terms
// are added in block order into one register per (row, entry), so every
// entry gets moe_mv's bits. No shared memory, no block barrier.
// grid = (ceil(n_out / DV_WARPS), tile bound), DV_WARPS warps.
template <class T, bool GU>
__device__ __forceinline__ void moe_dv(const u8* W0, const u8* W1, u64 rb, int n_out, int n_in,
                                       const int4* tiles, const int* n_tiles, const int* src, int div, int stride,
                                       const i8* aq, const float* ad, const float* as, const int* bs, float* out,
                                       const float* wts, float clamp) {
    constexpr int L = T::NSUB, U = DvU<T>::v, R = GU ? 2 : 1, G = WARP / L;
    static_assert(U % R == 0, "a step holds whole row pairs");
    pdl_wait();
    if ((int)blockIdx.y >= *n_tiles) return;
    int4 tile = tiles[blockIdx.y];
    int lane = threadIdx.x % WARP, sub = lane % L;
    int j = blockIdx.x * DV_WARPS + threadIdx.x / WARP;
    if (j >= n_out) return;  // the whole warp
    int cnt = tile.z, myrow = 0;  // lane t < cnt: entry t's activation row
    if (lane < cnt) {
        int p = tile.y + lane * stride;
        myrow = src ? src[p] / div : p;
    }
    int nch = n_in / 32, nb = nch / L;
    u64 nab = n_in / 32, nbs = n_in / 16;
    const u8* wr0 = W0 + ((u64)tile.x * n_out + j) * rb;
    const u8* wr1 = GU ? W1 + ((u64)tile.x * n_out + j) * rb : wr0;
    float acc[R][MV_NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < MV_NT; t++) acc[r][t] = 0.0f;
    int steps = (nch + WARP - 1) / WARP;  // chunks of a row per lane
    for (int i0 = 0; i0 < steps; i0 += U / R) {
        DvChunk<T> ch[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = (i0 + u / R) * WARP + lane;
            if (i0 + u / R < steps && c < nch)
                ch[u].load((u % R ? wr1 : wr0) + (u64)(c / L) * T::BYTES, c % L);
            else
                ch[u].clear();
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = i0 + u / R;
            if (i >= steps) break;  // uniform over the warp
            int c = i * WARP + lane, b = c / L;
            bool ok = c < nch;
            int q[8], s0, s1, m;
            ch[u].expand(q, s0, s1, m);
#pragma unroll
            for (int t = 0; t < MV_NT; t++) {
                if (t >= cnt) break;  // uniform over the warp
                int row = __shfl_sync(FULL_MASK, myrow, t);
                int is = 0, sm = 0;
                if (ok)
                    mv_chunk_dot<T>(q, s0, s1, m, aq + (u64)row * n_in + 32 * c, bs + (u64)row * nbs + 2 * c, is,
                                    sm);
#pragma unroll
                for (int o = L / 2; o > 0; o >>= 1) {
                    is += __shfl_xor_sync(FULL_MASK, is, o);
                    if (HasMin<T>::v) sm += __shfl_xor_sync(FULL_MASK, sm, o);
                }
                float term = 0.0f;
                if (ok) {
                    u64 ai = (u64)row * nab + b;
                    term = T::combine_h(ch[u].h, is, sm, ad[ai], T::ACT == 1 ? as[ai] : 0.0f);
                }
                // This step's blocks i G .. i G + G - 1, in order.
#pragma unroll
                for (int g = 0; g < G; g++) {
                    float v = __shfl_sync(FULL_MASK, term, g * L);
                    if (i * G + g < nb) acc[u % R][t] = __fadd_rn(acc[u % R][t], v);
                }
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < MV_NT; t++) {
            if (t >= cnt) break;
            u64 p = (u64)(tile.y + t * stride);
            out[p * n_out + j] = GU ? swiglu_clamped_w(acc[0][t], acc[R - 1][t], clamp, wts[src[p]]) : acc[0][t];
        }
    }
}

#define MV_PARAMS                                                                                  \
    const u8 *W0, const u8 *W1, u64 rb, int n_out, int n_in, int nr, const int4 *tiles,            \
        const int *n_tiles, const int *src, int div, int stride
#define MV_ARGS W0, W1, rb, n_out, n_in, nr, tiles, n_tiles, src, div, stride

#define MOE_MV(name, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(128) moe_mv_##name(                               \
        MV_PARAMS, const i8* aq, const float* ad, const float* as, const int* bs, float* out,      \
        const float* wts, float clamp) {                                                           \
        moe_mv<T, false>(MV_ARGS, aq, ad, as, bs, out, wts, clamp);                                \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) moe_mvgu_##name(                             \
        MV_PARAMS, const i8* aq, const float* ad, const float* as, const int* bs, float* out,      \
        const float* wts, float clamp) {                                                           \
        moe_mv<T, true>(MV_ARGS, aq, ad, as, bs, out, wts, clamp);                                 \
    }

#define DV_PARAMS                                                                                  \
    const u8 *W0, const u8 *W1, u64 rb, int n_out, int n_in, const int4 *tiles, const int *n_tiles, \
        const int *src, int div, int stride, const i8 *aq, const float *ad, const float *as,         \
        const int *bs, float *out, const float *wts, float clamp
#define DV_ARGS W0, W1, rb, n_out, n_in, tiles, n_tiles, src, div, stride, aq, ad, as, bs, out, wts, clamp

#define MOE_DV(name, T)                                                                            \
    extern "C" __global__ void __launch_bounds__(DV_WARPS * WARP, 8) moe_dv_##name(DV_PARAMS) {     \
        moe_dv<T, false>(DV_ARGS);                                                                 \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(DV_WARPS * WARP, 8) moe_dvgu_##name(DV_PARAMS) {   \
        moe_dv<T, true>(DV_ARGS);                                                                  \
    }

#define MOE_F(name, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(128) moe_f_##name(                                \
        MV_PARAMS, const float* x, int round16, float* out, const float* wts, float clamp) {       \
        moe_f<T, false>(MV_ARGS, x, round16, out, wts, clamp);                                     \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) moe_fgu_##name(                              \
        MV_PARAMS, const float* x, int round16, float* out, const float* wts, float clamp) {       \
        moe_f<T, true>(MV_ARGS, x, round16, out, wts, clamp);                                      \
    }

MOE_MV(q4_0, TQ4_0)
MOE_MV(q4_1, TQ4_1)
MOE_MV(q5_0, TQ5_0)
MOE_MV(q8_0, TQ8_0)
MOE_MV(q2_k, TQ2_K)
MOE_MV(q4_k, TQ4_K)
MOE_MV(q5_k, TQ5_K)
MOE_MV(q6_k, TQ6_K)
MOE_MV(iq2_xxs, TIQ2_XXS)

MOE_DV(q4_0, TQ4_0)
MOE_DV(q4_1, TQ4_1)
MOE_DV(q5_0, TQ5_0)
MOE_DV(q8_0, TQ8_0)
MOE_DV(q2_k, TQ2_K)
MOE_DV(q4_k, TQ4_K)
MOE_DV(q5_k, TQ5_K)
MOE_DV(q6_k, TQ6_K)
MOE_DV(iq2_xxs, TIQ2_XXS)

MOE_F(f32, TF32)
MOE_F(f16, TF16)
MOE_F(q4_0, TQ4_0)
MOE_F(q4_1, TQ4_1)
MOE_F(q5_0, TQ5_0)
MOE_F(q8_0, TQ8_0)
MOE_F(q2_k, TQ2_K)
MOE_F(q4_k, TQ4_K)
MOE_F(q5_k, TQ5_K)
MOE_F(q6_k, TQ6_K)
MOE_F(iq2_xxs, TIQ2_XXS)

// ---- the sum over a row's experts ------------------------------------------

// out[r] = the y rows of row r's entries (y[pos[r k + i]], entries with
// pos -1 skipped) added in ascending expert order, equal experts in slot
// order: the CPU's order (it adds expert by expert). Bound by reading
// y (k rows of d per row). grid = (rows, ceil(d / 512)), 128 threads, 4
// columns each; d % 4 == 0, k <= MAX_K.
extern "C" __global__ void __launch_bounds__(128) moe_reduce(const float* y, const int* pos, const float* ids,
                                                            float* out, int k, int d) {
    pdl_wait();
    int r = blockIdx.x;
    int order[MAX_K], ex[MAX_K], n = 0;
    for (int i = 0; i < k; i++) {
        int p = pos[(u64)r * k + i];
        if (p < 0) continue;
        int e = (int)ids[(u64)r * k + i];
        int at = n;
        while (at > 0 && ex[at - 1] > e) {  // stable: equal experts keep slot order
            ex[at] = ex[at - 1];
            order[at] = order[at - 1];
            at--;
        }
        ex[at] = e;
        order[at] = p;
        n++;
    }
    int c = 4 * (blockIdx.y * blockDim.x + threadIdx.x);
    if (c >= d) return;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < n; i++) {
        float4 v = *(const float4*)(y + (u64)order[i] * d + c);
        acc.x = __fadd_rn(acc.x, v.x);
        acc.y = __fadd_rn(acc.y, v.y);
        acc.z = __fadd_rn(acc.z, v.z);
        acc.w = __fadd_rn(acc.w, v.w);
    }
    *(float4*)(out + (u64)r * d + c) = acc;
}
