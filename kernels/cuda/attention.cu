// Paged causal attention over a KV pool (prepended: common.cuh). Launched
// only by kernels/src/cuda/attention.rs.
//
// Pool layout (the bytes Backend::kv_read_block returns): block b starts
// at element b * block_elems; inside it, for each layer l, the keys
// [block_size, kv_dim] then the values [block_size, kv_dim]
// (layer_off = l * 2 * block_size * kv_dim). Elements are f16 (u16 bits)
// or f32.
//
// Per q row the host passes info[4 * row ..] = {block, slot, pos,
// table_off}: where the row's k/v go (block -1: the row belongs to no
// sequence), its position, and where its sequence's block table starts
// in `tables`.

__device__ __forceinline__ float kv_ld(const u16* p) { return h2f(*p); }
__device__ __forceinline__ float kv_ld(const float* p) { return *p; }
__device__ __forceinline__ void kv_st(u16* p, float v) { *p = f2h(v); }
__device__ __forceinline__ void kv_st(float* p, float v) { *p = v; }

template <class E>
__device__ __forceinline__ void kv_store(const float* k, const float* v, E* pool, const int* info,
                                         int kv_dim, int bs, u64 block_elems, u64 layer_off) {
    int r = blockIdx.x;
    int blk = info[4 * r], slot = info[4 * r + 1];
    if (blk < 0) return;
    E* dk = pool + (u64)blk * block_elems + layer_off + (u64)slot * kv_dim;
    E* dv = dk + (u64)bs * kv_dim;
    for (int i = threadIdx.x; i < kv_dim; i += blockDim.x) {
        kv_st(dk + i, k[(u64)r * kv_dim + i]);
        kv_st(dv + i, v[(u64)r * kv_dim + i]);
    }
}

extern "C" __global__ void kv_store_f16(const float* k, const float* v, u16* pool, const int* info,
                                        int kv_dim, int bs, u64 block_elems, u64 layer_off) {
    pdl_wait();
    kv_store<u16>(k, v, pool, info, kv_dim, bs, block_elems, layer_off);
}

extern "C" __global__ void kv_store_f32(const float* k, const float* v, float* pool, const int* info,
                                        int kv_dim, int bs, u64 block_elems, u64 layer_off) {
    pdl_wait();
    kv_store<float>(k, v, pool, info, kv_dim, bs, block_elems, layer_off);
}

#define ATT_WARPS 4
// Kernels for head_dim <= 32 * MAXD: MAXD 2 (64), 4 (128), 16 (512).

// Split-KV ("flash decoding"): grid = (rows, n_head, n_split); block z
// covers positions [z * chunk, (z + 1) * chunk) of its row (clipped to
// 0 ..= pos). Each of the ATT_WARPS warps takes 32 positions at a time,
// one per lane: every lane computes its position's score q . k over the
// whole head (q in shared memory), the warp updates its online softmax
// (max m, sum l) once per 32 positions, then accumulates the 32 value
// rows with lane owning dims lane + 32 * i. The block merges its warps
// and writes the unnormalized partial result (m, l, acc[hd]) to
// part_*[(row * n_head + head) * n_split + z]; attn_merge combines the
// splits.

// elementwise.cu's rope of q and k fused with kv_store: one thread per
// (row, head of q then of k, pair slot of head_dim / 2). Slot i < n_rot / 2
// rotates its pair (mode 0: dims 2i, 2i + 1; 1: i, i + n_rot / 2); the
// other slots take the dims past n_rot two at a time. Key-head threads
// then store their two key values (rotated) and the same two value
// values in the pool, for rows of a sequence.
template <class E>
__device__ __forceinline__ void rope_kv_store(float* q, float* k, const float* v, const u32* pos, E* pool,
                                              const int* info, int rows, int q_cols, int kv_dim,
                                              int head_dim, int n_rot, float freq_base, float freq_scale,
                                              int mode, int bs, u64 block_elems, u64 layer_off) {
    int hp = head_dim / 2, half = n_rot / 2;
    int heads_q = q_cols / head_dim, heads = heads_q + kv_dim / head_dim;
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)rows * heads * hp) return;
    int i = (int)(g % hp);
    u64 rh = g / hp;
    int h = (int)(rh % heads);
    int r = (int)(rh / heads);
    bool key = h >= heads_q;
    int kh = h - heads_q;
    float* head = key ? k + (u64)r * kv_dim + (u64)kh * head_dim : q + (u64)r * q_cols + (u64)h * head_dim;
    int a, b;
    rope_pair(i, n_rot, mode, a, b);
    float x0 = head[a], x1 = head[b];
    if (i < half) {
        float c, s;
        rope_cs(pos[r], i, n_rot, freq_base, freq_scale, c, s);
        rope_rot(x0, x1, c, s);
        head[a] = x0;
        head[b] = x1;
    }
    if (!key) return;
    int blk = info[4 * r], slot = info[4 * r + 1];
    if (blk < 0) return;
    E* dk = pool + (u64)blk * block_elems + layer_off + (u64)slot * kv_dim + (u64)kh * head_dim;
    E* dv = dk + (u64)bs * kv_dim;
    const float* vr = v + (u64)r * kv_dim + (u64)kh * head_dim;
    kv_st(dk + a, x0);
    kv_st(dk + b, x1);
    kv_st(dv + a, vr[a]);
    kv_st(dv + b, vr[b]);
}

#define ROPE_KV_STORE(name, E)                                                                     \
    extern "C" __global__ void name(float* q, float* k, const float* v, const u32* pos, E* pool,  \
                                    const int* info, int rows, int q_cols, int kv_dim, int head_dim, \
                                    int n_rot, float freq_base, float freq_scale, int mode, int bs, \
                                    u64 block_elems, u64 layer_off) {                              \
        pdl_wait();                                                                                \
        rope_kv_store<E>(q, k, v, pos, pool, info, rows, q_cols, kv_dim, head_dim, n_rot, freq_base, \
                         freq_scale, mode, bs, block_elems, layer_off);                            \
    }

ROPE_KV_STORE(rope_kv_store_f16, u16)
ROPE_KV_STORE(rope_kv_store_f32, float)

// q . k over hd values at p (16-byte aligned when hd % 8 == 0).
__device__ __forceinline__ float qk_dot(const float* sq, const u16* p, int hd) {
    float s = 0.0f;
    if ((hd & 7) == 0) {
        const uint4* v = (const uint4*)p;
        for (int j = 0; j < hd / 8; j++) {
            uint4 w = v[j];
            u32 x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                s += sq[8 * j + 2 * k] * h2f((u16)(x[k] & 0xffff));
                s += sq[8 * j + 2 * k + 1] * h2f((u16)(x[k] >> 16));
            }
        }
    } else {
        for (int d = 0; d < hd; d++) s += sq[d] * h2f(p[d]);
    }
    return s;
}

__device__ __forceinline__ float qk_dot(const float* sq, const float* p, int hd) {
    float s = 0.0f;
    if ((hd & 3) == 0) {
        const float4* v = (const float4*)p;
        for (int j = 0; j < hd / 4; j++) {
            float4 w = v[j];
            s += sq[4 * j] * w.x + sq[4 * j + 1] * w.y + sq[4 * j + 2] * w.z + sq[4 * j + 3] * w.w;
        }
    } else {
        for (int d = 0; d < hd; d++) s += sq[d] * p[d];
    }
    return s;
}

// With fmt >= 0 (0: Q8_0, 1: Q8_1; set only by CudaBackend's fusion of
// the next matmul's activation quantization), the head output this block
// wrote at o (hd values, a whole number of 32-value blocks) is also
// quantized, as quant_warp256 does; flat: its offset in the [rows, cols]
// output.
__device__ __forceinline__ void attn_quant(const float* o, int hd, int fmt, u64 flat, int cols, i8* aq,
                                           float* ad, float* as, int* bs) {
    if (fmt < 0) return;
    __syncthreads();  // the block's writes of o
    int warp = threadIdx.x / WARP;
    for (int c = 256 * warp; c < hd; c += 256 * (blockDim.x / WARP)) {
        float v[8];
        bool valid = load_warp256(o + c, hd - c, v);
        quant_warp256(v, valid, fmt, flat + c, cols, aq, ad, as, bs);
    }
}

// qk_dot for a head size known at compile time: every load of the key
// row is issued before the first product (the loop over a runtime hd
// waits for each 16 bytes in turn), same sums in the same order.
template <int HD>
__device__ __forceinline__ float qk_dot_fixed(const float* sq, const u16* p) {
    const uint4* v = (const uint4*)p;
    uint4 w[HD / 8];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) w[j] = v[j];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        u32 x[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s += sq[8 * j + 2 * k] * h2f((u16)(x[k] & 0xffff));
            s += sq[8 * j + 2 * k + 1] * h2f((u16)(x[k] >> 16));
        }
    }
    return s;
}

template <int HD>
__device__ __forceinline__ float qk_dot_fixed(const float* sq, const float* p) {
    const float4* v = (const float4*)p;
    float4 w[HD / 4];
#pragma unroll
    for (int j = 0; j < HD / 4; j++) w[j] = v[j];
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < HD / 4; j++)
        s += sq[4 * j] * w[j].x + sq[4 * j + 1] * w[j].y + sq[4 * j + 2] * w[j].z + sq[4 * j + 3] * w[j].w;
    return s;
}

template <class E, int MAXD>
__device__ __forceinline__ void attn_part(const float* q, const E* pool, const u32* tables, const int* info,
                                          float* part_m, float* part_l, float* part_acc, int n_head,
                                          int n_head_kv, int hd, int bs, u64 block_elems, u64 layer_off,
                                          float scale, int chunk, float* out, int fmt, i8* aq,
                                          float* ad, float* as, int* qbs) {
    __shared__ float s_q[32 * MAXD];
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][32 * MAXD];
    int r = blockIdx.x, h = blockIdx.y, z = blockIdx.z, n_split = gridDim.z;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u64 pi = ((u64)r * n_head + h) * n_split + z;
    int pos = info[4 * r] < 0 ? -1 : info[4 * r + 2];
    int t0 = z * chunk, t1 = min(pos + 1, t0 + chunk);
    // One split (out set): the block's result is final; attn_merge is not
    // launched and rows of no sequence get zeros here.
    float* o = out ? out + ((u64)r * n_head + h) * hd : nullptr;
    u64 flat = ((u64)r * n_head + h) * hd;
    if (t0 >= t1) {
        if (o) {
            for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
            if constexpr (MAXD <= 4) attn_quant(o, hd, fmt, flat, n_head * hd, aq, ad, as, qbs);
        } else if (threadIdx.x == 0) {
            part_m[pi] = -__int_as_float(0x7f800000);
            part_l[pi] = 0.0f;
        }
        return;
    }
    int toff = info[4 * r + 3];
    int q_dim = n_head * hd, kv_dim = n_head_kv * hd;
    int kvh = h / (n_head / n_head_kv);
    const float* qr = q + (u64)r * q_dim + (u64)h * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) s_q[d] = qr[d];
    __syncthreads();
    float acc[MAXD];
#pragma unroll
    for (int i = 0; i < MAXD; i++) acc[i] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    for (int tb = t0 + 32 * warp; tb < t1; tb += 32 * ATT_WARPS) {
        int t = tb + lane;
        bool ok = t < t1;
        u64 off = 0;  // element offset of this lane's key row
        float s = -__int_as_float(0x7f800000);
        if (ok) {
            u32 blk = tables[toff + t / bs];
            off = (u64)blk * block_elems + layer_off + (u64)(t % bs) * kv_dim + (u64)kvh * hd;
            // Head sizes 64 and 128 (the d2 and d4 kernels' largest).
            if (MAXD <= 4 && hd == 32 * MAXD)
                s = qk_dot_fixed<32 * MAXD>(s_q, pool + off) * scale;
            else
                s = qk_dot(s_q, pool + off, hd) * scale;
        }
        float m_new = fmaxf(m, warp_max(s));
        float corr = expf(m - m_new);
        float p = ok ? expf(s - m_new) : 0.0f;
        l = l * corr + warp_sum(p);
#pragma unroll
        for (int i = 0; i < MAXD; i++) acc[i] *= corr;
        int n = min(32, t1 - tb);
        // Position j's value row, weighted, into acc.
        auto add_row = [&](int j) {
            float pj = __shfl_sync(FULL_MASK, p, j);
            u64 oj = __shfl_sync(FULL_MASK, off, j);
            const E* vp = pool + oj + (u64)bs * kv_dim;
#pragma unroll
            for (int i = 0; i < MAXD; i++) {
                int d = lane + 32 * i;
                if (d < hd) acc[i] += pj * kv_ld(vp + d);
            }
        };
        // Unrolled so that several positions' value loads are in flight:
        // a whole tile (heads of up to 128 values) loads 16 rows before
        // adding any (the same additions in the same order), else 8.
        if (MAXD <= 4 && n == 32) {
#pragma unroll
            for (int j0 = 0; j0 < 32; j0 += 16) {
                float v[16][MAXD];
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const E* vp = pool + __shfl_sync(FULL_MASK, off, j0 + j) + (u64)bs * kv_dim;
#pragma unroll
                    for (int i = 0; i < MAXD; i++) {
                        int d = lane + 32 * i;
                        v[j][i] = d < hd ? kv_ld(vp + d) : 0.0f;
                    }
                }
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    float pj = __shfl_sync(FULL_MASK, p, j0 + j);
#pragma unroll
                    for (int i = 0; i < MAXD; i++)
                        if (lane + 32 * i < hd) acc[i] += pj * v[j][i];
                }
            }
        } else {
#pragma unroll 8
            for (int j = 0; j < n; j++) add_row(j);
        }
        m = m_new;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
    for (int i = 0; i < MAXD; i++) {
        int d = lane + 32 * i;
        if (d < hd) s_acc[warp][d] = acc[i];
    }
    __syncthreads();
    float mm = -__int_as_float(0x7f800000);
    for (int w = 0; w < ATT_WARPS; w++)
        if (s_l[w] > 0.0f) mm = fmaxf(mm, s_m[w]);
    float f[ATT_WARPS];
    float ll = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        f[w] = s_l[w] > 0.0f ? expf(s_m[w] - mm) : 0.0f;
        ll += s_l[w] * f[w];
    }
    float* pa = part_acc + pi * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) v += s_acc[w][d] * f[w];
        if (o) {
            o[d] = v / ll;  // attn_merge's result for one split (e^0 = 1)
        } else {
            pa[d] = v;
        }
    }
    if (o) {
        // Head sizes up to 128 (the quantization code costs the 512 kernel
        // spills; the host fuses only into d2 and d4).
        if constexpr (MAXD <= 4) attn_quant(o, hd, fmt, flat, n_head * hd, aq, ad, as, qbs);
        return;
    }
    if (threadIdx.x == 0) {
        part_m[pi] = mm;
        part_l[pi] = ll;
    }
}

// attn_part_<elem>_d<MAXD>: one entry point per KV element type and head
// size class.
#define ATTN_PART(name, E, MAXD)                                                                   \
    extern "C" __global__ void __launch_bounds__(128)                                               \
    name(const float* q, const E* pool, const u32* tables, const int* info, float* part_m,          \
         float* part_l, float* part_acc, int n_head, int n_head_kv, int hd, int bs, u64 block_elems, \
         u64 layer_off, float scale, int chunk, float* out, int fmt, i8* aq, float* ad, float* as,  \
         int* qbs) {                                                                                \
        pdl_wait();                                                                                \
        attn_part<E, MAXD>(q, pool, tables, info, part_m, part_l, part_acc, n_head, n_head_kv, hd,  \
                           bs, block_elems, layer_off, scale, chunk, out, fmt, aq, ad, as, qbs);    \
    }

ATTN_PART(attn_part_f16_d2, u16, 2)
ATTN_PART(attn_part_f16_d4, u16, 4)
ATTN_PART(attn_part_f16_d16, u16, 16)
ATTN_PART(attn_part_f32_d2, float, 2)
ATTN_PART(attn_part_f32_d4, float, 4)
ATTN_PART(attn_part_f32_d16, float, 16)

// grid = (rows, n_head): out = sum_z acc_z e^(m_z - M) / sum_z l_z e^(m_z - M).
// Rows of no sequence get zeros.
extern "C" __global__ void attn_merge(const float* part_m, const float* part_l, const float* part_acc,
                                      const int* info, float* out, int n_head, int hd, int n_split) {
    pdl_wait();
    int r = blockIdx.x, h = blockIdx.y;
    float* o = out + ((u64)r * n_head + h) * hd;
    if (info[4 * r] < 0) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
        return;
    }
    u64 base = ((u64)r * n_head + h) * n_split;
    float mm = -__int_as_float(0x7f800000);
    for (int z = 0; z < n_split; z++)
        if (part_l[base + z] > 0.0f) mm = fmaxf(mm, part_m[base + z]);
    float ll = 0.0f;
    for (int z = 0; z < n_split; z++)
        if (part_l[base + z] > 0.0f) ll += part_l[base + z] * expf(part_m[base + z] - mm);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < n_split; z++)
            if (part_l[base + z] > 0.0f) v += part_acc[(base + z) * hd + d] * expf(part_m[base + z] - mm);
        o[d] = v / ll;
    }
}
