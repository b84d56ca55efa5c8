// Embedding gather: out[i, :] = dequantize(table[ids[i], :]) (prepended:
// common.cuh, quant.cuh, iq2.cuh). Launched only by
// kernels/src/cuda/embed.rs. grid = n_ids, each thread one 32-value chunk
// of the row (embed_i32: one value).

template <class T>
__device__ __forceinline__ void embed_impl(const u8* W, u64 row_bytes, const u32* ids, float* out, int cols) {
    u32 id = ids[blockIdx.x];
    const u8* wr = W + (u64)id * row_bytes;
    float* dst = out + (u64)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols / 32; c += blockDim.x) {
        float y[32];
        T::deq(wr + (u64)(c / T::NSUB) * T::BYTES, c % T::NSUB, y);
#pragma unroll
        for (int i = 0; i < 32; i++) dst[32 * c + i] = y[i];
    }
}

#define EMBED(name, T)                                                                            \
    extern "C" __global__ void embed_##name(const u8* W, u64 rb, const u32* ids, float* out, int cols) { \
        pdl_wait();                                                                                \
        embed_impl<T>(W, rb, ids, out, cols);                                                     \
    }

EMBED(f32, TF32)
EMBED(f16, TF16)
EMBED(q4_0, TQ4_0)
EMBED(q4_1, TQ4_1)
EMBED(q5_0, TQ5_0)
EMBED(q8_0, TQ8_0)
EMBED(q4_k, TQ4_K)
EMBED(q5_k, TQ5_K)
EMBED(q6_k, TQ6_K)
EMBED(q2_k, TQ2_K)
EMBED(iq2_xxs, TIQ2_XXS)

// I32 tables (any width): the values as f32, as the CPU dequantizes them.
extern "C" __global__ void embed_i32(const u8* W, u64 rb, const u32* ids, float* out, int cols) {
    pdl_wait();
    const int* wr = (const int*)(W + (u64)ids[blockIdx.x] * rb);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[(u64)blockIdx.x * cols + c] = (float)wr[c];
}
