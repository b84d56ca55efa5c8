// Shared definitions prepended to every ds4 kernel source before NVRTC
// compiles it (NVRTC sees no include path; see kernels/src/cuda/compile.rs).
// No standard headers: NVRTC programs here are self-contained.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define WARP 32
#define FULL_MASK 0xffffffffu

// f16 <-> f32 through PTX conversions (round to nearest even, like
// ggml's and the `half` crate's).
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

// The little-endian f16 at `p` (2-byte aligned).
__device__ __forceinline__ float ld_h(const u8* p) {
    return h2f(*(const u16*)p);
}

// Programmatic dependent launch (sm_90+). The host lets every kernel
// launch before the one ahead of it in the stream has finished; a kernel
// calls pdl_wait before it touches any memory that a kernel of its pass
// may write, and from there on sees everything the kernels ahead of it
// wrote. Before the wait it may read only weights (which nothing writes)
// and, where it says so, memory no kernel of the pass writes: the pass's
// uploads (copied before the pass's first kernel, which every later one
// starts after) and KV positions of earlier passes (decode_layer.cu). It
// then lets the next kernel launch, whose blocks can load their weights
// while this one runs. Before sm_90 both are no-ops (the host
// does not set the launch attribute there).
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Pulls the `bytes` at p into L2, a line per 128 bytes, thread i of n
// taking every n-th line: weights a kernel reads after pdl_wait, when the
// whole matrix (`total` bytes) is small. Matrices of a few MB and more
// lose by it (the 7B's decode step: 4.6% slower with, the SmolLM2 one
// 2.8% faster), since their blocks mostly start after the previous kernel.
__device__ __forceinline__ void prefetch_l2(const u8* p, u64 bytes, u64 total, int i, int n) {
    if (total > (2ull << 20)) return;
    for (u64 off = (u64)i * 128; off < bytes; off += (u64)n * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

// RoPE of pair i (of n_rot / 2) at position pos: the angle's cosine and
// sine in f64 like the CPU, then the rotation rounded op by op.
// elementwise.cu's rope and attention.cu's rope_kv_store share these, so
// both give the same bits.
__device__ __forceinline__ void rope_cs(u32 pos, int i, int n_rot, float freq_base, float freq_scale,
                                        float& c, float& s) {
    double inv_freq = pow((double)freq_base, -2.0 * (double)i / (double)n_rot);
    double theta = (double)pos * (double)freq_scale * inv_freq;
    c = (float)cos(theta);
    s = (float)sin(theta);
}

// The dims of pair slot i of a head (of head_dim / 2): slot i < n_rot / 2
// rotates (2i, 2i + 1) in mode 0 (normal) or (i, i + n_rot / 2) in mode 1
// (NeoX); the other slots take the dims past n_rot two at a time.
__device__ __forceinline__ void rope_pair(int i, int n_rot, int mode, int& a, int& b) {
    int half = n_rot / 2;
    a = i < half ? (mode == 0 ? 2 * i : i) : n_rot + 2 * (i - half);
    b = i < half ? (mode == 0 ? 2 * i + 1 : i + half) : a + 1;
}

// silu(g) * u rounded op by op like the CPU's SwiGLU.
__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// The routed experts' clamped SwiGLU times the route weight w in f64, as
// the CPU reference (cpu/hyper.rs, clamped_swiglu_value): silu(min(g, c))
// * clamp(u, -c, c) * w, rounded once to f32. The MoE matvecs (moe.cu)
// and the gathered tensor-core GEMM (matmul_tiled.cu) share it.
__device__ __forceinline__ float swiglu_clamped_w(float g, float u, float c, float w) {
    double gc = (double)fminf(g, c);
    double uc = (double)(u < -c ? -c : (u > c ? c : u));
    return (float)(gc / (1.0 + exp(-gc)) * uc * (double)w);
}

__device__ __forceinline__ void rope_rot(float& x0, float& x1, float c, float s) {
    float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    float y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    x0 = y0;
    x1 = y1;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Int8 tensor-core products (sm_80+; never launched below, see matmul.rs).
// Fragments (PTX ISA, mma.m16n8k16 / m16n8k32 .s8): lane = 4 * g + t; A
// regs hold rows g and g + 8 at bytes 4t .. 4t + 3 (k32: then rows g and
// g + 8 at bytes 16 + 4t ..); B regs hold column (token) g at k bytes 4t ..
// (k32: then 16 + 4t ..); C holds rows g, g + 8 x columns 2t, 2t + 1.

// c += a (16 x 16) * b (16 x 8).
__device__ __forceinline__ void mma_s8(int* c, int a0, int a1, int b0) {
#if __CUDA_ARCH__ < 800
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
#endif
}

// c += a (16 x 32) * b (32 x 8).
__device__ __forceinline__ void mma_s8_k32(int* c, const int* a, int b0, int b1) {
#if __CUDA_ARCH__ < 800
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}


// ---- asynchronous copies to shared memory (sm_80+) ----------------------

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}
