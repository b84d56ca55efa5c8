// Causal attention for prefill rows on f16 tensor cores, flash-attention
// style (prepended: common.cuh). Launched only by
// kernels/src/cuda/attention.rs, for production numerics over an f16 KV
// pool with head size 64 or 128; decode rows keep attention.cu's split-KV
// kernel.
//
// The host cuts each sequence's rows of the batch into tiles of up to 64
// consecutive rows (consecutive positions): tiles[4 * i ..] = {first row,
// rows, position of the first row, table_off}. grid = (tiles, n_head),
// 128 threads: warp w owns tile rows 16w .. 16w + 15. Per 64 keys of the
// sequence (0 .. the tile's last position), the block copies K and V
// (row-major f16, from the paged pool) into shared memory; each warp
// computes its 16 x 64 scores with mma.m16n8k16 (q rounded to f16, f32
// accumulation), masks future positions, updates its rows' running max
// and sum (f32), and adds P (rounded to f16) x V into f32 accumulators.
// Numerics: q and p are rounded to f16 (the CPU keeps them f32), so
// results differ from the CPU by about 1e-3 relative (cuda_parity states
// the tolerance).
//
// Fragments (PTX ISA, mma.m16n8k16 .f16, lane = 4 * g + t): A regs a0..a3
// = (row g, k 2t..2t+1), (row g + 8, same), (row g, k 8 + 2t..), (row
// g + 8, same); B regs = (k 2t..2t+1, column g), (k 8 + 2t.., column g);
// C = (row g, columns 2t, 2t + 1), (row g + 8, same).

#define FA_ROWS 64   // query rows per block (16 per warp)
#define FA_KEYS 64   // keys per step

__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

// c += a (16 x 16 f16) * b (16 x 8 f16), f32 accumulators.
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

// Two 8x8 f16 matrices at rows p (lanes 0-7: matrix 0, lanes 8-15:
// matrix 1), transposed: the B fragment of an mma whose k runs along the
// rows.
__device__ __forceinline__ void ldmatrix_x2_trans(u32& r0, u32& r1, const u16* p) {
#if __CUDA_ARCH__ < 800
    __trap();
#else
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                 : "=r"(r0), "=r"(r1)
                 : "r"(a));
#endif
}

template <int HD>
__device__ __forceinline__ void attn_prefill(const float* q, const u16* pool, const u32* tables,
                                             const int* tiles, int n_head, int n_head_kv, int bs,
                                             u64 block_elems, u64 layer_off, float scale, float* out) {
    constexpr int LD = HD + 8;  // shared row stride (halves): conflict-free fragment reads
    __shared__ __align__(16) u16 sk[FA_KEYS * LD];
    __shared__ __align__(16) u16 sv[FA_KEYS * LD];
    int tile = blockIdx.x, h = blockIdx.y;
    int row0 = tiles[4 * tile], n = tiles[4 * tile + 1], pos0 = tiles[4 * tile + 2];
    int toff = tiles[4 * tile + 3];
    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int g = lane >> 2, t = lane & 3;
    int kv_dim = n_head_kv * HD, kvh = h / (n_head / n_head_kv);
    int n_keys = pos0 + n;  // keys 0 .. the tile's last position

    // This lane's q fragments (rows g, g + 8 of the warp), rounded to f16.
    // Rows past the tile's end repeat its last row (never stored).
    u32 qa[HD / 16][4];
    int rl[2];
#pragma unroll
    for (int e = 0; e < 2; e++) rl[e] = min(16 * warp + g + 8 * e, n - 1);
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float* qr = q + (u64)(row0 + rl[e]) * n_head * HD + (u64)h * HD + 16 * ks + 2 * t;
            float2 lo = *(const float2*)qr, hi = *(const float2*)(qr + 8);
            qa[ks][e] = pack_h2(lo.x, lo.y);
            qa[ks][2 + e] = pack_h2(hi.x, hi.y);
        }
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) o[i][k] = 0.0f;
    float m[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)};
    float l[2] = {0.0f, 0.0f};  // this lane's share of each row's sum

    for (int kb = 0; kb < n_keys; kb += FA_KEYS) {
        // Copy keys kb .. kb + 63 (16 bytes per thread and step; V rows
        // past the last key are zeroed so that 0 x garbage cannot be NaN).
        for (int u = threadIdx.x; u < FA_KEYS * HD / 8; u += blockDim.x) {
            int key = u / (HD / 8), c = u % (HD / 8);
            int kp = kb + key;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = kw;
            if (kp < n_keys) {
                u32 blk = tables[toff + kp / bs];
                const u16* src = pool + (u64)blk * block_elems + layer_off + (u64)(kp % bs) * kv_dim +
                                 (u64)kvh * HD + 8 * c;
                kw = *(const uint4*)src;
                vw = *(const uint4*)(src + (u64)bs * kv_dim);
            }
            *(uint4*)(sk + key * LD + 8 * c) = kw;
            *(uint4*)(sv + key * LD + 8 * c) = vw;
        }
        __syncthreads();
        // Scores: 16 rows x 64 keys (8 tiles of 8 keys).
        float s[FA_KEYS / 8][4];
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++) {
#pragma unroll
            for (int k = 0; k < 4; k++) s[nt][k] = 0.0f;
            const u16* kr = sk + (8 * nt + g) * LD + 2 * t;
#pragma unroll
            for (int ks = 0; ks < HD / 16; ks++)
                mma_f16(s[nt], qa[ks], *(const u32*)(kr + 16 * ks), *(const u32*)(kr + 16 * ks + 8));
        }
        // Scale, causal mask, running max per row.
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int e = k >> 1, kp = kb + 8 * nt + 2 * t + (k & 1);
                float v = kp <= pos0 + rl[e] ? s[nt][k] * scale : -__int_as_float(0x7f800000);
                s[nt][k] = v;
                mx[e] = fmaxf(mx[e], v);
            }
        float corr[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(FULL_MASK, mx[e], 1));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(FULL_MASK, mx[e], 2));
            corr[e] = expf(m[e] - mx[e]);  // 0 on the first step (m = -inf)
            m[e] = mx[e];
            l[e] *= corr[e];
        }
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
#pragma unroll
            for (int k = 0; k < 4; k++) o[i][k] *= corr[k >> 1];
        // P = exp(s - max), rounded to f16 as the A operand of P x V.
        u32 pa[FA_KEYS / 16][4];
#pragma unroll
        for (int nt = 0; nt < FA_KEYS / 8; nt++) {
            float p[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                p[k] = expf(s[nt][k] - m[k >> 1]);
                l[k >> 1] += p[k];
            }
            pa[nt / 2][2 * (nt & 1)] = pack_h2(p[0], p[1]);
            pa[nt / 2][2 * (nt & 1) + 1] = pack_h2(p[2], p[3]);
        }
        // O += P V: k = keys (16 per step), n = 8 head dims per tile.
#pragma unroll
        for (int ks = 0; ks < FA_KEYS / 16; ks++) {
            const u16* vr = sv + (16 * ks + (lane & 15)) * LD;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                u32 b0, b1;
                ldmatrix_x2_trans(b0, b1, vr + 8 * i);
                mma_f16(o[i], pa[ks], b0, b1);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
        l[e] += __shfl_xor_sync(FULL_MASK, l[e], 1);
        l[e] += __shfl_xor_sync(FULL_MASK, l[e], 2);
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
        int r = 16 * warp + g + 8 * e;
        if (r >= n) continue;
        float* orow = out + (u64)(row0 + r) * n_head * HD + (u64)h * HD + 2 * t;
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
            *(float2*)(orow + 8 * i) = make_float2(o[i][2 * e] / l[e], o[i][2 * e + 1] / l[e]);
    }
}

#define ATTN_PREFILL(name, HD)                                                                      \
    extern "C" __global__ void __launch_bounds__(128)                                               \
    name(const float* q, const u16* pool, const u32* tables, const int* tiles, int n_head,          \
         int n_head_kv, int bs, u64 block_elems, u64 layer_off, float scale, float* out) {         \
        pdl_wait();                                                                                \
        attn_prefill<HD>(q, pool, tables, tiles, n_head, n_head_kv, bs, block_elems, layer_off,     \
                         scale, out);                                                                \
    }

ATTN_PREFILL(attn_prefill_d64, 64)
ATTN_PREFILL(attn_prefill_d128, 128)
