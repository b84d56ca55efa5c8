// A whole dense decoder layer (llama layout) for one token, in one launch
// on a thread-block cluster (sm_90+; prepended: common.cuh, quant.cuh).
// Launched only by kernels/src/cuda/decode_layer.rs.
//
// A batch-1 decode step of a small model is a chain of short dependent
// kernels (norm, q/k/v, RoPE + KV store, attention, o, norm, gate/up,
// SwiGLU, down), each a few round trips to memory on a handful of blocks.
// Here the DL_CL blocks of one cluster run the whole layer: every block
// keeps its own copy of the residual row and of each stage's input in
// shared memory and computes its share of each matrix's rows into its
// own shared memory; after the stage's cluster barrier (a few hundred ns)
// the blocks read the rows they need from the blocks that computed them
// (distributed shared memory):
//
//   norm + quantize (each block, whole row)
//   q/k/v rows -> qkv                              | barrier, read own heads
//   RoPE, KV store, attention split -> part        | barrier
//   merge splits (read), quantize; o rows -> ob    | barrier, read ob
//   norm(x + ob) + quantize; gate/up rows, silu(g) * u -> act | barrier, read act
//   quantize; down rows -> db of block 0           | barrier
//   block 0 writes x + ob + db
//
// The numerics are the unfused kernels': activations quantized to Q8_1
// (quant_warp256), Q4_1 x Q8_1 blocks combined like the CPU, RoPE angles
// in f64, an f16 KV pool. Sums (f32 here, also the norms' sums of
// squares) run in another order, so results agree with the unfused path
// to rounding.
//
// Before its pdl_wait a block reads what no kernel of the pass writes:
// the RoPE angles of its position, the keys and values of earlier
// positions, its warps' q/k/v weight blocks (registers), and starts
// copying its rows of o, gate, up and down into shared memory (about
// 130 KB for SmolLM2); the next layer's launch, which starts as soon as
// this one has waited, does the same on other SMs while this one
// computes.
//
// Per-warp work is cheap only when few warps do it: a block's warps
// share four schedulers, so work every warp repeats costs its
// instructions once per warp (hence one warp per 256 values in the
// norms). 768 threads a block measured 1.5-2 us a layer faster than
// 1024 (bench/NOTES.md).
//
// Shared memory (dynamic; decode_layer.rs computes the same size): see
// DlMem below. Pool layout and info as attention.cu.

#define DL_CL 16
#ifndef DL_THREADS
#define DL_THREADS 768
#endif
#define DL_WARPS (DL_THREADS / WARP)
#define DL_GW (DL_CL * DL_WARPS)
// q/k/v rows a warp loads into registers before the wait (wider layers
// take the rest one at a time).
#define DL_PRE ((2048 + DL_THREADS - 1) / DL_THREADS)
#define DL_HD 64
#define DL_MAXG 4
#define DL_NEG_INF __int_as_float(0xff800000)

// Stage marks for bench/cuda/decode_layer_phases.cu (nothing here).
#ifndef DL_MARK
#define DL_MARK(i)
#endif

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ u32 cl_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cl_arrive() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cl_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
// Every block's writes (its own and remote shared memory) before, visible
// to every block after.
__device__ __forceinline__ void cl_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of p (this block's shared memory) in block `rank`.
__device__ __forceinline__ u32 at_rank(const float* p, u32 rank) {
    u32 a, ra;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    return ra;
}
// v at p in block `rank` of the cluster.
__device__ __forceinline__ void st_rank(float* p, u32 rank, float v) {
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(at_rank(p, rank)), "f"(v) : "memory");
}
// The value at p in block `rank` of the cluster.
__device__ __forceinline__ float ld_rank(const float* p, u32 rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(at_rank(p, rank)) : "memory");
    return v;
}
#else
__device__ __forceinline__ u32 cl_rank() { __trap(); return 0; }
__device__ __forceinline__ void cl_arrive() { __trap(); }
__device__ __forceinline__ void cl_wait() { __trap(); }
__device__ __forceinline__ void cl_sync() { __trap(); }
__device__ __forceinline__ void st_rank(float*, u32, float) { __trap(); }
__device__ __forceinline__ float ld_rank(const float*, u32) { __trap(); return 0.0f; }
#endif

// Rows of a matvec stage stay in the block whose warp computed them (see
// dl_matvec); after the stage's cluster barrier the blocks that need a
// row read it from there (one remote load per row per block, a warp's 32
// rows from one block). Pushing every row into every block instead (16
// remote stores per row) made each stage about 0.6 us slower.
__device__ __forceinline__ u32 row_owner(int r) { return (u32)((r % DL_GW) / DL_WARPS); }

// v at p (every lane holds it; lane 0 stores).
__device__ __forceinline__ void put(float* p, float v) {
    if (threadIdx.x % WARP == 0) *p = v;
}

// This block's copy of rows [0, n) of buf from their owners; then a barrier.
__device__ __forceinline__ void dl_gather(float* buf, int n) {
    for (int i = threadIdx.x; i < n; i += DL_THREADS) buf[i] = ld_rank(buf + i, row_owner(i));
    __syncthreads();
}

// A Q8_1 activation row in shared memory.
struct Q8Act {
    i8* q;
    float* d;
    float* s;
};

// The shared memory of a block (floats).
struct DlMem {
    float* xs;     // E: the residual row
    float* rc;     // 32: RoPE cosines of this position
    float* rs;     // 32: and sines
    float* qkv;    // QD + 2 KVD: q, k, v
    float* qr;     // (G + 1) * 64: this block's q heads and key head, rotated
    float* part;   // H * NS * 66: each (head, split)'s (m, l, acc[64])
    float* wpart;  // G * DL_WARPS * 66: each warp's (m, l, acc[64]) per head
    float* ob;     // E: o rows
    float* att;    // QD: attention output
    float* act;    // F: silu(gate) * up
    float* db;     // E: down rows
    Q8Act a;       // max(E, QD, F) quants, / 32 scales and sums
    // This block's rows of o, gate, up and down (see dl_stage), 16-byte
    // aligned.
    u8* wo;
    u8* wg;
    u8* wu;
    u8* wd;
};

// Rows of an n-row matrix a block keeps: warp w of block b computes rows
// k DL_GW + b DL_WARPS + w, kept at row k DL_WARPS + w.
__device__ __forceinline__ int dl_rows(int n) { return (n + DL_GW - 1) / DL_GW * DL_WARPS; }

// Bytes of a Q4_1 row of n values.
__device__ __forceinline__ int q41_row(int n) { return n / 32 * TQ4_1::BYTES; }

__device__ __forceinline__ DlMem dl_mem(float* base, int E, int F, int H, int HK) {
    int QD = H * DL_HD, KVD = HK * DL_HD, G = H / HK, NS = DL_CL / HK;
    int A = max(max(E, QD), F);
    DlMem m;
    float* p = base;
    // Each region a multiple of 16 bytes (float4 and int2 accesses).
#define DL_TAKE(f, n) m.f = p; p += ((n) + 3) & ~3;
    DL_TAKE(xs, E)
    DL_TAKE(rc, 32)
    DL_TAKE(rs, 32)
    DL_TAKE(qkv, QD + 2 * KVD)
    DL_TAKE(qr, (G + 1) * DL_HD)
    DL_TAKE(part, H * NS * (DL_HD + 2))
    DL_TAKE(wpart, G * DL_WARPS * (DL_HD + 2))
    DL_TAKE(ob, E)
    DL_TAKE(att, QD)
    DL_TAKE(act, F)
    DL_TAKE(db, E)
    DL_TAKE(a.d, A / 32)
    DL_TAKE(a.s, A / 32)
#undef DL_TAKE
    m.a.q = (i8*)p;  // A bytes (a multiple of 32)
    u8* w = (u8*)p + A;
#define DL_TAKEW(f, n, rb) m.f = w; w += ((u64)dl_rows(n) * (rb) + 15) & ~(u64)15;
    DL_TAKEW(wo, E, q41_row(QD))
    DL_TAKEW(wg, F, q41_row(E))
    DL_TAKEW(wu, F, q41_row(E))
    DL_TAKEW(wd, E, q41_row(F))
#undef DL_TAKEW
    return m;
}

// Starts copying this block's rows of w (n rows of rb bytes, 16-byte
// aligned) into ws: for each k, the DL_WARPS rows from k DL_GW +
// rank DL_WARPS on are one contiguous run (see dl_rows). Asynchronous:
// cp_async_wait<0> and a barrier before they are read.
__device__ __forceinline__ void dl_stage(u8* ws, const u8* w, int n, int rb, u32 rank) {
    for (int k = 0;; k++) {
        int r0 = k * DL_GW + (int)rank * DL_WARPS, rows = min(DL_WARPS, n - r0);
        if (rows <= 0) break;
        u64 bytes = (u64)rows * rb;
        const u8* src = w + (u64)r0 * rb;
        u8* dst = ws + (u64)k * DL_WARPS * rb;
        for (u64 i = 16 * threadIdx.x; i + 16 <= bytes; i += 16 * DL_THREADS) cp_async16(dst + i, src + i);
        for (u64 i = bytes / 16 * 16 + 4 * threadIdx.x; i < bytes; i += 4 * DL_THREADS) cp_async4(dst + i, src + i);
    }
    cp_async_commit();
}

// Q8_1 of the n values at src (shared memory) into a; then a barrier.
__device__ __forceinline__ void dl_quant(const float* src, int n, Q8Act a) {
    int warp = threadIdx.x / WARP;
    for (int c = 256 * warp; c < n; c += 256 * DL_WARPS) {
        float v[8];
        bool valid = load_warp256(src + c, n - c, v);
        quant_warp256(v, valid, 1, (u64)c, n, a.q, a.d, a.s, nullptr);
    }
    __syncthreads();
}

// rms_norm(x (+ y)) * w over n values, quantized to Q8_1 into a; then a
// barrier. No block reduction: each warp that quantizes (one per 256
// values) sums all the squares itself; the others go to the barrier (a
// block's warps share four schedulers: work every warp repeats costs
// its instructions 32 times).
__device__ __forceinline__ void dl_norm(const float* x, const float* y, const float* w, int n, float eps,
                                        Q8Act a) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (256 * warp < n) {
        float s = 0.0f;
        for (int i = lane; i < n; i += WARP) {
            float f = y ? __fadd_rn(x[i], y[i]) : x[i];
            s += f * f;
        }
        s = warp_sum(s);
        float scale = (float)(1.0 / sqrt((double)s / (double)n + (double)eps));
        for (int c = 256 * warp; c < n; c += 256 * DL_WARPS) {
            float v[8];
            bool valid = 8 * lane < n - c;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int i = c + 8 * lane + j;
                float f = valid ? (y ? __fadd_rn(x[i], y[i]) : x[i]) : 0.0f;
                v[j] = valid ? __fmul_rn(__fmul_rn(f, scale), w[i]) : 0.0f;
            }
            quant_warp256(v, valid, 1, (u64)c, n, a.q, a.d, a.s, nullptr);
        }
    }
    __syncthreads();
}

// A Q4_1 block as five words: the f16 scale and min, then the 16 bytes of
// nibbles (blocks are 20 bytes at 4-byte aligned addresses).
__device__ __forceinline__ void q41_load(const u8* blk, u32* w) {
    const u32* p = (const u32*)blk;
#pragma unroll
    for (int i = 0; i < 5; i++) w[i] = p[i];
}

// The block's contribution to a dot with block b of a (TQ4_1's words and
// combine, so the same value as matmul.cu's kernels).
__device__ __forceinline__ float q41_dot(const u32* w, const Q8Act& a, int b) {
    const int* y = (const int*)(a.q + 32 * b);
    int isum = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) isum = __dp4a((int)(w[1 + i] & 0x0f0f0f0fu), y[i], isum);
#pragma unroll
    for (int i = 0; i < 4; i++) isum = __dp4a((int)((w[1 + i] >> 4) & 0x0f0f0f0fu), y[4 + i], isum);
    return TQ4_1::combine_h(w[0], isum, 0, a.d[b], a.s[b]);
}

// N rows of Q4_1 x the Q8_1 row a (nb blocks), row n at rows[n] (null:
// skipped, 0); every lane gets the sums. Lane l takes blocks l, l + 32, ..
// of all N rows, so their loads go out together.
template <int N>
__device__ __forceinline__ void dl_dots(const u8* const* rows, int nb, const Q8Act& a, float* out) {
    int lane = threadIdx.x % WARP;
    float s[N];
#pragma unroll
    for (int n = 0; n < N; n++) s[n] = 0.0f;
    for (int b = lane; b < nb; b += WARP) {
        u32 w[N][5];
#pragma unroll
        for (int n = 0; n < N; n++)
            if (rows[n]) q41_load(rows[n] + (u64)b * TQ4_1::BYTES, w[n]);
#pragma unroll
        for (int n = 0; n < N; n++)
            if (rows[n]) s[n] += q41_dot(w[n], a, b);
    }
#pragma unroll
    for (int n = 0; n < N; n++) out[n] = warp_sum(s[n]);
}

// out[r] = W r . a for rows r < n of W (nb blocks a row), this block's
// rows of W in ws (see dl_stage): the cluster's warps take rows gw,
// gw + DL_GW, .. and keep them in their own block (to < 0), or store
// them in block `to`.
__device__ __forceinline__ void dl_matvec(const u8* ws, int n, int nb, const Q8Act& a, float* out, int gw,
                                          int to = -1) {
    int rb = nb * TQ4_1::BYTES, warp = threadIdx.x / WARP;
    for (int k = 0; k * DL_GW + gw < n; k += 2) {
        int r = k * DL_GW + gw, r2 = r + DL_GW;
        const u8* rows[2] = {ws + (u64)(k * DL_WARPS + warp) * rb,
                             r2 < n ? ws + (u64)((k + 1) * DL_WARPS + warp) * rb : nullptr};
        float v[2];
        dl_dots<2>(rows, nb, a, v);
        for (int j = 0; j < 2 && r + j * DL_GW < n; j++) {
            if (to < 0)
                put(out + r + j * DL_GW, v[j]);
            else if (threadIdx.x % WARP == 0)
                st_rank(out + r + j * DL_GW, (u32)to, v[j]);
        }
    }
}

// Where position p's key of kv head kh starts in the pool (the value is
// bs * KVD further), lane's two dims.
__device__ __forceinline__ const u16* kv_at(const u16* pool, const u32* table, int p, int kh, int KVD, int bs,
                                            u64 block_elems, u64 layer_off) {
    return pool + (u64)table[p / bs] * block_elems + layer_off + (u64)(p % bs) * KVD + (u64)kh * DL_HD +
           2 * (threadIdx.x % WARP);
}

// Attention of this block's q heads (G of kv head kh) over positions
// [lo, hi): each warp takes positions lo + warp + 32 i, four at a time,
// lane owning dims 2 lane, 2 lane + 1; then the block merges its warps
// into part (every block's copy) at split `split`. kw / vw: the keys and
// values (two f16 each) of the warp's first four positions below `pos`,
// loaded before the kernel's wait; position pos itself is this pass's
// key and value, as stored (rounded to f16).
__device__ __forceinline__ void dl_attend(const DlMem& m, const u32* kw0, const u32* vw0, const u16* pool,
                                          const u32* table, int lo, int hi, int pos, int G, int kh, int split,
                                          int NS, int QD, int KVD, int bs, u64 block_elems, u64 layer_off,
                                          float scale) {
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    float qa[DL_MAXG], qb[DL_MAXG], mx[DL_MAXG], l[DL_MAXG], a0[DL_MAXG], a1[DL_MAXG];
#pragma unroll
    for (int g = 0; g < DL_MAXG; g++) {
        if (g < G) {
            qa[g] = m.qr[g * DL_HD + 2 * lane];
            qb[g] = m.qr[g * DL_HD + 2 * lane + 1];
        }
        mx[g] = DL_NEG_INF;
        l[g] = 0.0f;
        a0[g] = 0.0f;
        a1[g] = 0.0f;
    }
    u32 knew = (u32)f2h(m.qr[G * DL_HD + 2 * lane]) | ((u32)f2h(m.qr[G * DL_HD + 2 * lane + 1]) << 16);
    const float* vn = m.qkv + QD + KVD + kh * DL_HD + 2 * lane;
    u32 vnew = (u32)f2h(vn[0]) | ((u32)f2h(vn[1]) << 16);
    for (int p0 = lo + warp; p0 < hi; p0 += 4 * DL_WARPS) {
        u32 kw[4], vw[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int p = p0 + j * DL_WARPS;
            if (p == pos) {
                kw[j] = knew;
                vw[j] = vnew;
            } else if (p0 == lo + warp) {
                kw[j] = kw0[j];
                vw[j] = vw0[j];
            } else if (p < hi) {
                const u16* kp = kv_at(pool, table, p, kh, KVD, bs, block_elems, layer_off);
                kw[j] = *(const u32*)kp;
                vw[j] = *(const u32*)(kp + (u64)bs * KVD);
            }
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (p0 + j * DL_WARPS >= hi) break;
            float k0 = lo_h(kw[j]), k1 = hi_h(kw[j]), v0 = lo_h(vw[j]), v1 = hi_h(vw[j]);
#pragma unroll
            for (int g = 0; g < DL_MAXG; g++) {
                if (g >= G) break;
                float sc = warp_sum(qa[g] * k0 + qb[g] * k1) * scale;
                float mn = fmaxf(mx[g], sc);
                float c = expf(mx[g] - mn), e = expf(sc - mn);
                l[g] = l[g] * c + e;
                a0[g] = a0[g] * c + e * v0;
                a1[g] = a1[g] * c + e * v1;
                mx[g] = mn;
            }
        }
    }
    // Warps past the range hold nothing: merge only those that ran.
    int nw = min(DL_WARPS, max(0, hi - lo));
    if (warp < nw) {
#pragma unroll
        for (int g = 0; g < DL_MAXG; g++) {
            if (g >= G) break;
            float* w = m.wpart + (g * DL_WARPS + warp) * (DL_HD + 2);
            if (lane == 0) {
                w[0] = mx[g];
                w[1] = l[g];
            }
            w[2 + 2 * lane] = a0[g];
            w[3 + 2 * lane] = a1[g];
        }
    }
    __syncthreads();
    int t = threadIdx.x;
    if (t < G * DL_HD) {
        int g = t / DL_HD, d = t % DL_HD;
        const float* w = m.wpart + g * DL_WARPS * (DL_HD + 2);
        float M = DL_NEG_INF;
        for (int i = 0; i < nw; i++) M = fmaxf(M, w[i * (DL_HD + 2)]);
        float L = 0.0f, A = 0.0f;
        for (int i = 0; i < nw; i++) {
            float e = expf(w[i * (DL_HD + 2)] - M);
            L += w[i * (DL_HD + 2) + 1] * e;
            A += w[i * (DL_HD + 2) + 2 + d] * e;
        }
        float* dst = m.part + ((kh * G + g) * NS + split) * (DL_HD + 2);
        dst[2 + d] = A;
        if (d == 0) {
            dst[0] = M;
            dst[1] = L;
        }
    }
}

// The attention output (the NS splits of every head merged, a thread per
// value, reading the splits from the blocks that computed them: head h's
// split s is in block (h / G) * NS + s, see dl_attend) into att, then
// quantized to Q8_1 into a.
__device__ __forceinline__ void dl_merge(const DlMem& m, int QD, int G, int NS) {
    for (int t = threadIdx.x; t < QD; t += DL_THREADS) {
        int h = t / DL_HD, d = t % DL_HD;
        u32 r0 = (u32)((h / G) * NS);
        const float* p = m.part + h * NS * (DL_HD + 2);
        float M = DL_NEG_INF, L = 0.0f, A = 0.0f;
#pragma unroll 4
        for (int s = 0; s < NS; s++) {
            const float* q = p + s * (DL_HD + 2);
            float ms = ld_rank(q, r0 + s), ls = ld_rank(q + 1, r0 + s), as = ld_rank(q + 2 + d, r0 + s);
            if (ms == DL_NEG_INF) continue;
            float mn = fmaxf(M, ms), c = expf(M - mn), e = expf(ms - mn);
            L = L * c + ls * e;
            A = A * c + as * e;
            M = mn;
        }
        m.att[t] = A / L;
    }
    __syncthreads();
    dl_quant(m.att, QD, m.a);
}

extern "C" __global__ void __cluster_dims__(DL_CL, 1, 1) __launch_bounds__(DL_THREADS, 1)
decode_layer_q4_1(float* x, const float* attn_norm, const float* ffn_norm, const u8* wq, const u8* wk,
                  const u8* wv, const u8* wo, const u8* wg, const u8* wu, const u8* wd, u16* pool,
                  const int* info, const u32* tables, int E, int F, int H, int HK, float eps, float scale,
                  int n_rot, float freq_base, float freq_scale, int mode, int bs, u64 block_elems,
                  u64 layer_off) {
    extern __shared__ __align__(16) double dl_smem[];
    int QD = H * DL_HD, KVD = HK * DL_HD, G = H / HK, NS = DL_CL / HK, R = QD + 2 * KVD;
    int nb = E / 32;
    u64 rb = (u64)nb * TQ4_1::BYTES;
    u32 rank = cl_rank();
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, gw = (int)rank * DL_WARPS + warp;
    DlMem m = dl_mem((float*)dl_smem, E, F, H, HK);

    // ---- Before the wait: only memory no kernel of this pass writes. The
    // weights; the pass's uploads (info, tables), copied before its first
    // kernel, which every later one of the pass starts after; the pool's
    // positions below pos, written by earlier passes.
    DL_MARK(0);
    int blk = info[0], slot = info[1], pos = info[2];
    const u32* table = tables + info[3];
    int kh = (int)rank / NS, split = (int)rank % NS;
    int chunk = (pos + NS) / NS;  // ceil((pos + 1) / NS)
    int lo = split * chunk, hi = kh < HK ? min(lo + chunk, pos + 1) : lo;
    hi = max(lo, hi);
    // RoPE angles of pos.
    if (threadIdx.x < n_rot / 2)
        rope_cs((u32)pos, threadIdx.x, n_rot, freq_base, freq_scale, m.rc[threadIdx.x], m.rs[threadIdx.x]);
    // The keys and values of this warp's first four positions.
    u32 kw[4], vw[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int p = lo + warp + j * DL_WARPS;
        kw[j] = vw[j] = 0;
        if (p < hi && p < pos) {
            const u16* kp = kv_at(pool, table, p, kh, KVD, bs, block_elems, layer_off);
            kw[j] = *(const u32*)kp;
            vw[j] = *(const u32*)(kp + (u64)bs * KVD);
        }
    }
    // Row r of q, k, v stacked (null past them).
    auto qkv_row = [&](int r) -> const u8* {
        return r >= R ? nullptr
               : r < QD ? wq + (u64)r * rb
               : r < QD + KVD ? wk + (u64)(r - QD) * rb
                              : wv + (u64)(r - QD - KVD) * rb;
    };
    // This warp's first DL_PRE q/k/v rows (gw, gw + DL_GW, ..): lane's
    // first block.
    const u8* qkv_rows[DL_PRE];
    u32 wr[DL_PRE][5];
#pragma unroll
    for (int j = 0; j < DL_PRE; j++) {
        qkv_rows[j] = qkv_row(gw + j * DL_GW);
        if (qkv_rows[j] && lane < nb) q41_load(qkv_rows[j] + (u64)lane * TQ4_1::BYTES, wr[j]);
    }
    // This block's rows of the other matrices into shared memory (read
    // from the o stage on).
    dl_stage(m.wo, wo, E, q41_row(QD), rank);
    dl_stage(m.wg, wg, F, (int)rb, rank);
    dl_stage(m.wu, wu, F, (int)rb, rank);
    dl_stage(m.wd, wd, E, q41_row(F), rank);
    pdl_wait();
    DL_MARK(1);
    // Every block has started before any writes into another's memory.
    cl_arrive();
    for (int i = threadIdx.x; i < E; i += DL_THREADS) m.xs[i] = x[i];

    // q, k, v.
    dl_norm(x, nullptr, attn_norm, E, eps, m.a);
    DL_MARK(2);
    cl_wait();
    {
        float s[DL_PRE];
#pragma unroll
        for (int j = 0; j < DL_PRE; j++) {
            s[j] = 0.0f;
            if (!qkv_rows[j]) continue;
            if (lane < nb) s[j] = q41_dot(wr[j], m.a, lane);
            for (int b = lane + WARP; b < nb; b += WARP) {
                u32 w[5];
                q41_load(qkv_rows[j] + (u64)b * TQ4_1::BYTES, w);
                s[j] += q41_dot(w, m.a, b);
            }
        }
#pragma unroll
        for (int j = 0; j < DL_PRE; j++) {
            float v = warp_sum(s[j]);
            if (qkv_rows[j]) put(m.qkv + gw + j * DL_GW, v);
        }
        // Rows past those a warp preloads (wider layers).
        for (int r = gw + DL_PRE * DL_GW; r < R; r += DL_GW) {
            const u8* rows[1] = {qkv_row(r)};
            float v[1];
            dl_dots<1>(rows, nb, m.a, v);
            put(m.qkv + r, v[0]);
        }
    }
    DL_MARK(3);
    cl_sync();
    if (kh < HK) {
        // This block's q heads, key head and value head.
        int t = threadIdx.x;
        if (t < (G + 2) * DL_HD) {
            int i = t < G * DL_HD ? kh * G * DL_HD + t
                    : t < (G + 1) * DL_HD ? QD + kh * DL_HD + t - G * DL_HD
                                          : QD + KVD + kh * DL_HD + t - (G + 1) * DL_HD;
            m.qkv[i] = ld_rank(m.qkv + i, row_owner(i));
        }
        __syncthreads();
    }
    DL_MARK(4);

    // RoPE, KV store, attention: block (kh, split) for kv head kh < HK.
    if (kh < HK) {
        int t = threadIdx.x;
        if (t < (G + 1) * (DL_HD / 2)) {
            int hi2 = t / (DL_HD / 2), i = t % (DL_HD / 2), a, b;
            const float* src = hi2 < G ? m.qkv + (kh * G + hi2) * DL_HD : m.qkv + QD + kh * DL_HD;
            float* dst = m.qr + hi2 * DL_HD;
            rope_pair(i, n_rot, mode, a, b);
            float x0 = src[a], x1 = src[b];
            if (i < n_rot / 2) rope_rot(x0, x1, m.rc[i], m.rs[i]);
            dst[a] = x0;
            dst[b] = x1;
        }
        __syncthreads();
        DL_MARK(5);
        if (lo <= pos && pos < hi && blk >= 0 && t < DL_HD) {
            // The new key and value (this block reads them from registers).
            u16* dk = pool + (u64)blk * block_elems + layer_off + (u64)slot * KVD + (u64)kh * DL_HD;
            dk[t] = f2h(m.qr[G * DL_HD + t]);
            dk[(u64)bs * KVD + t] = f2h(m.qkv[QD + KVD + kh * DL_HD + t]);
        }
        dl_attend(m, kw, vw, pool, table, lo, hi, pos, G, kh, split, NS, QD, KVD, bs, block_elems, layer_off,
                  scale);
    }
    DL_MARK(6);
    cl_sync();
    DL_MARK(7);

    // Merge the splits (its barrier also publishes the staged weights); o.
    cp_async_wait<0>();
    dl_merge(m, QD, G, NS);
    DL_MARK(8);
    dl_matvec(m.wo, E, QD / 32, m.a, m.ob, gw);
    DL_MARK(9);
    cl_sync();
    dl_gather(m.ob, E);
    DL_MARK(10);

    // norm of x + o; gate/up with SwiGLU.
    dl_norm(m.xs, m.ob, ffn_norm, E, eps, m.a);
    DL_MARK(11);
    for (int k = 0; k * DL_GW + gw < F; k += 2) {
        int j = k * DL_GW + gw, j2 = j + DL_GW;
        u64 o1 = (u64)(k * DL_WARPS + warp) * rb, o2 = o1 + (u64)DL_WARPS * rb;
        const u8* rows[4] = {m.wg + o1, m.wu + o1, j2 < F ? m.wg + o2 : nullptr, j2 < F ? m.wu + o2 : nullptr};
        float v[4];
        dl_dots<4>(rows, nb, m.a, v);
        put(m.act + j, silu_mul(v[0], v[1]));
        if (j2 < F) put(m.act + j2, silu_mul(v[2], v[3]));
    }
    DL_MARK(12);
    cl_sync();
    DL_MARK(13);

    // down; x + o + down.
    dl_gather(m.act, F);
    dl_quant(m.act, F, m.a);
    DL_MARK(14);
    // Only block 0 needs the down rows (it writes x): stored there.
    dl_matvec(m.wd, E, F / 32, m.a, m.db, gw, 0);
    DL_MARK(15);
    cl_sync();
    DL_MARK(16);
    if (rank == 0)
        for (int i = threadIdx.x; i < E; i += DL_THREADS) x[i] = __fadd_rn(__fadd_rn(m.xs[i], m.ob[i]), m.db[i]);
}
