// Attention with sinks over a compressed-attention pool (prepended:
// common.cuh). Launched only by kernels/src/cuda/compressed_attention.rs;
// the CPU reference is cpu/compressed.rs `compressed_attention`. Pool
// layout and the seqinfo / rowinfo / tab tables: see compressed.cu.
//
// Each query row at position p attends over one shared K=V row per key:
// the raw rows of positions max(0, p - window + 1) ..= p (its window
// blocks), then the layer's pooled rows visible at p (all (p + 1) / ratio
// of them, or the row's `selected` indices, -1 skipped). The head's sink
// logit joins the softmax denominator only.
//
// Split-K ("flash decoding"): grid = (rows, heads / CA_WARPS, splits);
// block z covers keys [z * chunk, (z + 1) * chunk) of its row's list and
// each of its warps one head, so the key rows a block reads serve
// CA_WARPS heads (the other warps find them in L1). A warp takes 32 keys
// at a time: every lane owns dims 128 j + 4 lane .. + 3 (JD = head_dim /
// 128 float4s), computes its part of the 32 keys' dot products, and one
// transposing butterfly (31 shuffles) leaves lane l with key l's score;
// the online softmax then adds the 32 rows, weighted, to the lane's dims.
// One split writes the output; several write unnormalized partials
// (m, l, acc) that comp_attn_merge combines with the sink. Bound by the
// key rows read (each from L2 once per block) and the 4 * head_dim flops
// per key and head.

#define CA_WARPS 8
#define NEG_INF (-__int_as_float(0x7f800000))

template <int JD>
__device__ __forceinline__ void ld_key(const u8* row, int f16, int lane, float (&v)[JD][4]) {
#pragma unroll
    for (int j = 0; j < JD; j++) {
        int d = 128 * j + 4 * lane;
        if (f16) {
            uint2 w = *(const uint2*)(row + 2 * (u64)d);
            v[j][0] = h2f((u16)(w.x & 0xffff));
            v[j][1] = h2f((u16)(w.x >> 16));
            v[j][2] = h2f((u16)(w.y & 0xffff));
            v[j][3] = h2f((u16)(w.y >> 16));
        } else {
            float4 w = *(const float4*)(row + 4 * (u64)d);
            v[j][0] = w.x;
            v[j][1] = w.y;
            v[j][2] = w.z;
            v[j][3] = w.w;
        }
    }
}

// One step of the transposing butterfly: lanes keep the half of
// part[0 .. 2 OFF) their bit OFF selects, adding the partner's.
template <int OFF>
__device__ __forceinline__ void butterfly(float (&part)[32], int lane) {
    bool upper = lane & OFF;
#pragma unroll
    for (int i = 0; i < OFF; i++) {
        float send = upper ? part[i] : part[i + OFF];
        float keep = upper ? part[i + OFF] : part[i];
        part[i] = keep + __shfl_xor_sync(FULL_MASK, send, OFF);
    }
}

// Everything a block needs to find its row's keys.
struct Keys {
    const float* sel;
    const u32* tab;
    const u8* windows;
    const u8* blocks;
    u64 wstride, bstride, raw_off, rows_at;
    int top_k, ratio, bs, hd, rb, toff, woff, ntab, first, nr, row;

    // Key i of the row's list (null: skipped).
    __device__ __forceinline__ const u8* ptr(int i) const {
        if (i < nr) {
            int pp = first + i;
            int bi = pp / bs;
            if (bi >= ntab) return nullptr;
            u32 w = tab[woff + bi];
            if (w == 0xffffffffu) return nullptr;
            return windows + (u64)w * wstride + (raw_off + pp % bs) * hd * rb;
        }
        int c = i - nr;
        if (sel) {
            c = (int)sel[(u64)row * top_k + c];
            if (c < 0) return nullptr;
        }
        int bi = (int)((i64)c * ratio / bs);
        if (bi >= ntab) return nullptr;
        u32 b = tab[toff + bi];
        if (b == 0xffffffffu) return nullptr;
        return blocks + (u64)b * bstride + (rows_at + (u64)(c % (bs / ratio)) * hd) * rb;
    }
};

template <int JD>
__device__ __forceinline__ void comp_attn(const float* q, float* out, const float* sinks, const float* sel,
                                          int top_k, const int* seqinfo, const int* rowinfo, const u32* tab,
                                          const u8* windows, u64 wstride, u64 raw_off, const u8* blocks,
                                          u64 bstride, u64 rows_at, int ratio, int bs, int window, int n_head,
                                          float scale, int f16, int chunk, float* part_m, float* part_l,
                                          float* part_acc) {
    const int hd = 128 * JD;
    int r = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int h = blockIdx.y * CA_WARPS + warp;
    int s = rowinfo[2 * r];
    if (s < 0 || h >= n_head) return;
    int p = rowinfo[2 * r + 1];
    const int* sq = seqinfo + 8 * s;
    Keys ks{sel, tab, windows, blocks, wstride, bstride, raw_off, rows_at, top_k, ratio, bs, hd, f16 ? 2 : 4,
            sq[1], sq[2], sq[6], max(0, p - window + 1), 0, r};
    ks.nr = p - ks.first + 1;
    int npool = ratio == 0 ? 0 : (sel ? top_k : (p + 1) / ratio);
    int nk = ks.nr + npool;
    int n_split = gridDim.z, z = blockIdx.z;
    int k0 = z * chunk, k1 = min(nk, k0 + chunk);
    float qv[JD][4];
    {
        const float* qr = q + ((u64)r * n_head + h) * hd;
#pragma unroll
        for (int j = 0; j < JD; j++) {
            float4 w = *(const float4*)(qr + 128 * j + 4 * lane);
            qv[j][0] = w.x;
            qv[j][1] = w.y;
            qv[j][2] = w.z;
            qv[j][3] = w.w;
        }
    }
    float m = NEG_INF, l = 0.0f;
    float acc[JD][4];
#pragma unroll
    for (int j = 0; j < JD; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    for (int tb = k0; tb < k1; tb += 32) {
        int nt = min(32, k1 - tb);
        const u8* kp = lane < nt ? ks.ptr(tb + lane) : nullptr;
        u64 kpi = (u64)kp;
        float part[32];
#pragma unroll
        for (int kk = 0; kk < 32; kk++) {
            part[kk] = 0.0f;
            const u8* pk = (const u8*)__shfl_sync(FULL_MASK, kpi, kk);
            if (pk) {
                float kv[JD][4];
                ld_key<JD>(pk, f16, lane, kv);
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < JD; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) d += qv[j][e] * kv[j][e];
                part[kk] = d;
            }
        }
        // Transposing butterfly: lane l ends with the sum of part[l].
        butterfly<16>(part, lane);
        butterfly<8>(part, lane);
        butterfly<4>(part, lane);
        butterfly<2>(part, lane);
        butterfly<1>(part, lane);
        float sc = kp ? part[0] * scale : NEG_INF;
        float m_new = fmaxf(m, warp_max(sc));
        if (m_new == NEG_INF) continue;  // no key in this tile
        float corr = expf(m - m_new);
        float pw = kp ? expf(sc - m_new) : 0.0f;
        l = l * corr + warp_sum(pw);
#pragma unroll
        for (int j = 0; j < JD; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] *= corr;
        for (int kk = 0; kk < nt; kk++) {
            const u8* pk = (const u8*)__shfl_sync(FULL_MASK, kpi, kk);
            float wk = __shfl_sync(FULL_MASK, pw, kk);
            if (pk) {
                float kv[JD][4];
                ld_key<JD>(pk, f16, lane, kv);
#pragma unroll
                for (int j = 0; j < JD; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[j][e] += wk * kv[j][e];
            }
        }
        m = m_new;
    }
    u64 pi = ((u64)r * n_head + h) * n_split + z;
    if (n_split == 1) {
        // M = max(sink, m); out = acc e^(m - M) / (e^(sink - M) + l e^(m - M)).
        float sink = sinks[h];
        float mm = fmaxf(sink, m);
        float f = expf(m - mm);
        float den = expf(sink - mm) + l * f;
        float* o = out + ((u64)r * n_head + h) * hd;
#pragma unroll
        for (int j = 0; j < JD; j++) {
            float4 w = make_float4(acc[j][0] * f / den, acc[j][1] * f / den, acc[j][2] * f / den,
                                   acc[j][3] * f / den);
            *(float4*)(o + 128 * j + 4 * lane) = w;
        }
        return;
    }
    if (lane == 0) {
        part_m[pi] = m;
        part_l[pi] = l;
    }
    float* pa = part_acc + pi * hd;
#pragma unroll
    for (int j = 0; j < JD; j++)
        *(float4*)(pa + 128 * j + 4 * lane) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
}

#define COMP_ATTN(name, JD)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * CA_WARPS)                                          \
        name(const float* q, float* out, const float* sinks, const float* sel, int top_k, const int* seqinfo, \
             const int* rowinfo, const u32* tab, const u8* windows, u64 wstride, u64 raw_off,            \
             const u8* blocks, u64 bstride, u64 rows_at, int ratio, int bs, int window, int n_head,      \
             float scale, int f16, int chunk, float* part_m, float* part_l, float* part_acc) {           \
        pdl_wait();                                                                                      \
        comp_attn<JD>(q, out, sinks, sel, top_k, seqinfo, rowinfo, tab, windows, wstride, raw_off,       \
                      blocks, bstride, rows_at, ratio, bs, window, n_head, scale, f16, chunk, part_m,    \
                      part_l, part_acc);                                                                 \
    }

COMP_ATTN(comp_attn_d128, 1)
COMP_ATTN(comp_attn_d256, 2)
COMP_ATTN(comp_attn_d512, 4)

// grid = (rows, n_head): the splits of comp_attn combined with the sink,
// out = sum_z acc_z e^(m_z - M) / (e^(sink - M) + sum_z l_z e^(m_z - M)),
// M = max(sink, m_z). Rows of no sequence are left as they are.
extern "C" __global__ void comp_attn_merge(const float* part_m, const float* part_l, const float* part_acc,
                                           const int* rowinfo, const float* sinks, float* out, int n_head,
                                           int hd, int n_split) {
    pdl_wait();
    int r = blockIdx.x, h = blockIdx.y;
    if (rowinfo[2 * r] < 0) return;
    u64 base = ((u64)r * n_head + h) * n_split;
    float sink = sinks[h];
    float mm = sink;
    for (int z = 0; z < n_split; z++)
        if (part_l[base + z] > 0.0f) mm = fmaxf(mm, part_m[base + z]);
    float den = expf(sink - mm);
    for (int z = 0; z < n_split; z++)
        if (part_l[base + z] > 0.0f) den += part_l[base + z] * expf(part_m[base + z] - mm);
    float* o = out + ((u64)r * n_head + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < n_split; z++)
            if (part_l[base + z] > 0.0f) v += part_acc[(base + z) * hd + d] * expf(part_m[base + z] - mm);
        o[d] = v / den;
    }
}
