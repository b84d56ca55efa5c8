// The lightning indexer's selection (prepended: common.cuh). Launched
// only by kernels/src/cuda/indexer.rs; the CPU reference is
// cpu/compressed.rs `indexer_select`. Pool layout and the seqinfo / tab
// tables: see compressed.cu.
//
// Two steps per chunk of query rows:
// 1. scores: for every query row at position p and every indexer row
//    c < (p + 1) / 4 of its sequence, score = sum_h w_h max(0, q_h . k_c)
//    into a [rows, ldk] f32 scratch. Queries come in groups of up to
//    IX_QG consecutive rows of one sequence (groups[4 g ..] = {sequence,
//    first row, rows, first scratch row}); a block stages its group's
//    queries and weights in shared memory and walks tiles of the
//    sequence's indexer rows (grid.y blocks share the tiles of a group).
//    ix_score_mma (f16 rows of 128, sm_80+) runs the q.k products on the
//    tensor cores (f16 inputs, exact for the FP4-rounded values of
//    production numerics, f32 accumulation): per warp 16 indexer rows x
//    8 heads per mma.m16n8k16, the 16 rows' fragments held in registers
//    across the group's queries. Bound by the indexer rows read (decode)
//    or by the tensor cores (prefill: 2 x 128 flops per row, head and
//    query). ix_score_simt (f32 rows) runs them in f32, a thread per
//    indexer row.
// 2. ix_topk, a block per query row: the top_k best scores by a 4-pass
//    radix select on the scores' order-preserving bits, then one pass
//    writing the selected indices in ascending order (ties at the
//    threshold to the lower index); rows with no more than top_k visible
//    rows get them all, padded with -1. Bound by 5 reads of the row's
//    scores.

#define IX_QG 4
#define IX_WARPS 8
#define IX_TILE (16 * IX_WARPS)
// f16 per staged query head row: 128 + 32 of padding, so that the 16-byte
// fragment loads of a quarter warp hit distinct banks.
#define IX_QROW 160
#define TK_THREADS 512

// c += a (16 x 16, f16) * b (16 x 8, f16), f32 accumulation.
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ < 800
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// A group of query rows: its sequence, first row, rows, first scratch
// row, the sequence's block table and the first row's position p0.
struct Group {
    int seq, r0, nq, srow, toff, ntab, p0;
};

__device__ __forceinline__ Group load_group(const int* groups, const int* seqinfo) {
    const int* g = groups + 4 * blockIdx.x;
    Group gr{g[0], g[1], g[2], g[3], 0, 0, 0};
    const int* sq = seqinfo + 8 * gr.seq;
    gr.toff = sq[1];
    gr.ntab = sq[6];
    gr.p0 = sq[5] + (gr.r0 - sq[3]);
    return gr;
}

// Indexer row c of the sequence (null past its block table).
__device__ __forceinline__ const u8* key_row(const Group& g, const u32* tab, const u8* blocks, u64 bstride,
                                             u64 rows_at, int per, int dim, int rb, int c) {
    int bi = c / per;
    if (bi >= g.ntab) return nullptr;
    u32 b = tab[g.toff + bi];
    if (b == 0xffffffffu) return nullptr;
    return blocks + (u64)b * bstride + (rows_at + (u64)(c % per) * dim) * rb;
}

// Lane (g, t) of a warp holds, for rows g and g + 8 of a 16-row tile and
// for head g of an 8-head tile, dims 32 i + 8 t .. + 7 (i = 0..3) as four
// 16-byte loads; k-step s of the mma takes the pair registers
// {4 (s / 2) + 2 (s % 2), + 1}. A and B use the same mapping of dims to
// the mma's k index, so the products sum over all 128 dims (in an order
// of the tensor core's choosing).
extern "C" __global__ void __launch_bounds__(32 * IX_WARPS)
    ix_score_mma(const float* q, const float* w, const int* groups, const int* seqinfo, const u32* tab,
                 const u8* blocks, u64 bstride, u64 rows_at, int bs, int n_head, float* scores, int ldk) {
    pdl_wait();
    extern __shared__ __align__(16) u8 smem[];
    int hp = (n_head + 7) & ~7;
    u16* qs = (u16*)smem;
    float* ws = (float*)(smem + (u64)IX_QG * hp * IX_QROW * 2);
    Group g = load_group(groups, seqinfo);
    int nvis_max = (g.p0 + g.nq) / 4;
    for (int i = threadIdx.x; i < IX_QG * hp * 128; i += blockDim.x) {
        int d = i % 128, h = (i / 128) % hp, qi = i / (128 * hp);
        float v = qi < g.nq && h < n_head ? q[((u64)(g.r0 + qi) * n_head + h) * 128 + d] : 0.0f;
        qs[((u64)qi * hp + h) * IX_QROW + d] = f2h(v);
    }
    for (int i = threadIdx.x; i < IX_QG * hp; i += blockDim.x) {
        int h = i % hp, qi = i / hp;
        ws[i] = qi < g.nq && h < n_head ? w[(u64)(g.r0 + qi) * n_head + h] : 0.0f;
    }
    __syncthreads();
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, t = lane % 4;
    int per = bs / 4;
    for (int tile = blockIdx.y; tile * IX_TILE < nvis_max; tile += gridDim.y) {
        int base = tile * IX_TILE + warp * 16;
        if (base >= nvis_max) continue;
        u32 a[2][16];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int c = base + gq + 8 * hh;
            const uint4* src =
                c < nvis_max ? (const uint4*)key_row(g, tab, blocks, bstride, rows_at, per, 128, 2, c) : nullptr;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint4 v = src ? src[4 * i + t] : make_uint4(0, 0, 0, 0);
                a[hh][4 * i] = v.x;
                a[hh][4 * i + 1] = v.y;
                a[hh][4 * i + 2] = v.z;
                a[hh][4 * i + 3] = v.w;
            }
        }
        for (int qi = 0; qi < g.nq; qi++) {
            int nvis = (g.p0 + qi + 1) / 4;
            if (base >= nvis) continue;
            const u16* qrow = qs + (u64)qi * hp * IX_QROW;
            const float* wq = ws + qi * hp;
            float s0 = 0.0f, s1 = 0.0f;
            for (int nt = 0; nt < hp / 8; nt++) {
                const uint4* qb = (const uint4*)(qrow + (u64)(nt * 8 + gq) * IX_QROW);
                u32 b[16];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    uint4 v = qb[4 * i + t];
                    b[4 * i] = v.x;
                    b[4 * i + 1] = v.y;
                    b[4 * i + 2] = v.z;
                    b[4 * i + 3] = v.w;
                }
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    int m = 4 * (s / 2) + 2 * (s % 2);
                    u32 av[4] = {a[0][m], a[1][m], a[0][m + 1], a[1][m + 1]};
                    mma_f16(c, av, b[m], b[m + 1]);
                }
                int h0 = nt * 8 + 2 * t;
                float w0 = wq[h0], w1 = wq[h0 + 1];
                s0 += w0 * fmaxf(c[0], 0.0f) + w1 * fmaxf(c[1], 0.0f);
                s1 += w0 * fmaxf(c[2], 0.0f) + w1 * fmaxf(c[3], 0.0f);
            }
            s0 += __shfl_xor_sync(FULL_MASK, s0, 1);
            s0 += __shfl_xor_sync(FULL_MASK, s0, 2);
            s1 += __shfl_xor_sync(FULL_MASK, s1, 1);
            s1 += __shfl_xor_sync(FULL_MASK, s1, 2);
            if (t == 0) {
                float* srow = scores + (u64)(g.srow + qi) * ldk;
                if (base + gq < nvis) srow[base + gq] = s0;
                if (base + gq + 8 < nvis) srow[base + gq + 8] = s1;
            }
        }
    }
}

// The same scores in f32 (any dim divisible by 4; f16 or f32 rows), a
// thread per indexer row, 8 heads at a time; the group's queries are
// staged in f32.
extern "C" __global__ void __launch_bounds__(256)
    ix_score_simt(const float* q, const float* w, const int* groups, const int* seqinfo, const u32* tab,
                  const u8* blocks, u64 bstride, u64 rows_at, int bs, int n_head, int dim, int f16,
                  float* scores, int ldk) {
    pdl_wait();
    extern __shared__ __align__(16) u8 smem[];
    float* qs = (float*)smem;
    float* ws = qs + (u64)IX_QG * n_head * dim;
    Group g = load_group(groups, seqinfo);
    int nvis_max = (g.p0 + g.nq) / 4;
    for (int i = threadIdx.x; i < IX_QG * n_head * dim; i += blockDim.x) {
        int qi = i / (n_head * dim);
        qs[i] = qi < g.nq ? q[(u64)(g.r0 + qi) * n_head * dim + i % (n_head * dim)] : 0.0f;
    }
    for (int i = threadIdx.x; i < IX_QG * n_head; i += blockDim.x) {
        int qi = i / n_head;
        ws[i] = qi < g.nq ? w[(u64)(g.r0 + qi) * n_head + i % n_head] : 0.0f;
    }
    __syncthreads();
    int per = bs / 4, rb = f16 ? 2 : 4;
    for (int tile = blockIdx.y; tile * 256 < nvis_max; tile += gridDim.y) {
        int c = tile * 256 + threadIdx.x;
        if (c >= nvis_max) continue;
        const u8* kr = key_row(g, tab, blocks, bstride, rows_at, per, dim, rb, c);
        for (int qi = 0; qi < g.nq; qi++) {
            if (c >= (g.p0 + qi + 1) / 4) continue;
            float sc = 0.0f;
            for (int h0 = 0; kr && h0 < n_head; h0 += 8) {
                float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                for (int d = 0; d < dim; d += 4) {
                    float kv[4];
                    if (f16) {
                        uint2 v = *(const uint2*)(kr + 2 * (u64)d);
                        kv[0] = h2f((u16)(v.x & 0xffff));
                        kv[1] = h2f((u16)(v.x >> 16));
                        kv[2] = h2f((u16)(v.y & 0xffff));
                        kv[3] = h2f((u16)(v.y >> 16));
                    } else {
                        float4 v = *(const float4*)(kr + 4 * (u64)d);
                        kv[0] = v.x;
                        kv[1] = v.y;
                        kv[2] = v.z;
                        kv[3] = v.w;
                    }
#pragma unroll
                    for (int hh = 0; hh < 8; hh++) {
                        if (h0 + hh >= n_head) break;
                        const float* qh = qs + ((u64)qi * n_head + h0 + hh) * dim + d;
                        acc[hh] += qh[0] * kv[0] + qh[1] * kv[1] + qh[2] * kv[2] + qh[3] * kv[3];
                    }
                }
#pragma unroll
                for (int hh = 0; hh < 8; hh++)
                    if (h0 + hh < n_head) sc += ws[qi * n_head + h0 + hh] * fmaxf(acc[hh], 0.0f);
            }
            scores[(u64)(g.srow + qi) * ldk + c] = sc;
        }
    }
}

// Order-preserving bits of an f32 (larger float, larger unsigned; -0
// below +0, as f64::total_cmp orders the CPU's scores).
__device__ __forceinline__ u32 ord_bits(float f) {
    u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Exclusive prefix sum of v over the block; *total gets the block's sum.
__device__ __forceinline__ u32 block_excl_scan(u32 v, u32* s_warp, u32* total) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    u32 incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u32 x = __shfl_up_sync(FULL_MASK, incl, o);
        if (lane >= o) incl += x;
    }
    __syncthreads();  // earlier readers of s_warp are done
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        u32 x = lane < nw ? s_warp[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(FULL_MASK, x, o);
            if (lane >= o) x += y;
        }
        if (lane < nw) s_warp[lane] = x;
    }
    __syncthreads();
    *total = s_warp[nw - 1];
    return (warp > 0 ? s_warp[warp - 1] : 0) + incl - v;
}

// grid = (groups, IX_QG): block (g, i) selects for the group's i-th row.
extern "C" __global__ void __launch_bounds__(TK_THREADS)
    ix_topk(const float* scores, int ldk, const int* groups, const int* seqinfo, float* out, int top_k) {
    pdl_wait();
    __shared__ u32 hist[256];
    __shared__ u32 s_pick[2];
    __shared__ u32 s_warp[32];
    Group g = load_group(groups, seqinfo);
    int qi = blockIdx.y;
    if (qi >= g.nq) return;
    int row = g.r0 + qi;
    int nvis = (g.p0 + qi + 1) / 4;
    float* o = out + (u64)row * top_k;
    int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    if (nvis <= top_k) {
        for (int i = tid; i < top_k; i += blockDim.x) o[i] = i < nvis ? (float)i : -1.0f;
        return;
    }
    const float* sc = scores + (u64)(g.srow + qi) * ldk;
    // Radix select, 8 bits a pass from the top: after the passes, T is the
    // bits of the top_k-th best score and kk how many scores equal to it
    // are taken (the rest of the top_k are above it).
    u32 prefix = 0, mask = 0, kk = (u32)top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < nvis; i += blockDim.x) {
            u32 u = ord_bits(sc[i]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1u);
        }
        __syncthreads();
        if (warp == 0) {
            // Lane l holds bins 255 - 8 l - j (j = 0..7), best first.
            u32 cnt[8], sum = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                cnt[j] = hist[255 - 8 * lane - j];
                sum += cnt[j];
            }
            u32 incl = sum;
#pragma unroll
            for (int o2 = 1; o2 < 32; o2 <<= 1) {
                u32 x = __shfl_up_sync(FULL_MASK, incl, o2);
                if (lane >= o2) incl += x;
            }
            u32 before = incl - sum;
            if (before < kk && kk <= incl) {
                u32 acc = before;
                for (int j = 0; j < 8; j++) {
                    if (acc + cnt[j] >= kk) {
                        s_pick[0] = 255 - 8 * lane - j;
                        s_pick[1] = acc;
                        break;
                    }
                    acc += cnt[j];
                }
            }
        }
        __syncthreads();
        prefix |= s_pick[0] << shift;
        mask |= 0xffu << shift;
        kk -= s_pick[1];
        __syncthreads();  // s_pick and hist are rewritten next pass
    }
    // Compaction in index order, 8 scores a thread per round: a score
    // above T goes to (scores above T before it) + min(scores equal to T
    // before it, kk); the first kk scores equal to T go to (above before)
    // + (equal before).
    u32 gt_base = 0, eq_base = 0;
    for (int base = 0; base < nvis; base += TK_THREADS * 8) {
        int i0 = base + 8 * tid;
        u32 u[8];
        int n = min(8, nvis - i0);
        if (n == 8) {
            float4 a = *(const float4*)(sc + i0), b = *(const float4*)(sc + i0 + 4);
            u[0] = ord_bits(a.x), u[1] = ord_bits(a.y), u[2] = ord_bits(a.z), u[3] = ord_bits(a.w);
            u[4] = ord_bits(b.x), u[5] = ord_bits(b.y), u[6] = ord_bits(b.z), u[7] = ord_bits(b.w);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) u[e] = e < n ? ord_bits(sc[i0 + e]) : 0;
        }
        u32 ngt = 0, neq = 0;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (e >= n) break;
            ngt += u[e] > prefix;
            neq += u[e] == prefix;
        }
        u32 total;
        u32 ex = block_excl_scan(ngt | (neq << 16), s_warp, &total);
        u32 gtb = gt_base + (ex & 0xffff), eqb = eq_base + (ex >> 16);
        for (int e = 0; e < n; e++) {
            if (u[e] > prefix) {
                o[gtb + min(eqb, kk)] = (float)(i0 + e);
                gtb++;
            } else if (u[e] == prefix) {
                if (eqb < kk) o[gtb + eqb] = (float)(i0 + e);
                eqb++;
            }
        }
        gt_base += total & 0xffff;
        eq_base += total >> 16;
    }
}
