/*
 * ops_kda_chunk.cu - the chunked KDA forward (MODEL_SPEC 3, "Chunked form"):
 * the function kc_kda_step computes token by token, 64 tokens at a time.
 *
 * Stages (one launch each, in stream order; kda_chunk.h has the buffers):
 *   plan   one block: the chunk table (item, chunk-in-item) of every 64-row
 *          chunk of every live item; items are packed without padding, so a
 *          chunk's rows are row0 + 64 c .. of its own item only.
 *   prep   block per (chunk, head, q|k|v), a channel's rows in 4-8 groups:
 *          short conv + SiLU (the first taps-1 positions of an item read the
 *          slot's conv tail), L2 norms, q scale, gate gk = -exp(A_log)
 *          softplus(graw + dt_bias) and its cumulative sum Gam within the
 *          chunk, beta = sigmoid.
 *   intra  block per (chunk, head): L and the masked q.k matrix, A = (I+L)^-1
 *          by blockwise forward substitution, W = A beta k exp(Gam),
 *          U = A beta v, qg = q exp(Gam), kg = k exp(Gam_last - Gam); for
 *          few chunks in two launches (pass 1 per K slice, then the solve
 *          and one K or value slice per block: intra_split).
 *   recur  block per (item, head, BV value columns): walks the item's chunks
 *          in order with its K x BV slice of the state in shared memory:
 *          Vnew = U - W S, S = exp(Gam_last) S + kg^T Vnew; stores the state
 *          at each chunk's start and Vnew, the final state to the slot.
 *          Value columns of the state are independent, so the BV split
 *          multiplies the parallelism of one long prompt by V / BV.
 *   out    block per (chunk, head, row block of out_split): O = qg S_c +
 *          Aqk Vnew, then the gated output RMSNorm, bf16 out.
 *   tail   block per item: the new conv tail (after prep, which read the old).
 * Sequence split (seq_split > 1), for long items when heads x V / BV blocks
 * leave SMs idle: an item's chunks form segments; one launch runs segment 0
 * from the slot's state and, for every other segment, its transition
 * S_end = M S_start + B by the same recurrence on [I | 0] (K + V columns,
 * U = 0 for the identity's); a combine kernel scans the segments
 * (start(s) = M_{s-1} start(s-1) + B_{s-1}) and writes the final state; a
 * third launch reruns segments >= 1 from their true starts for the output
 * stage's S_c and Vnew. The transitions cost K/V times the state's work again.
 *
 * Numerics. Only non-positive numbers are exponentiated. Within a chunk the
 * 64 x 64 triangular matrices are built from 16 x 16 sub-blocks: diagonal
 * sub-blocks elementwise (exp(Gam_r - Gam_s), s <= r); the sub-blocks below
 * diagonal block j as one product of two factors around the reference row
 * ref = 16 j + 15 (the last row of block j): k_r exp(Gam_r - Gam_ref) for the
 * rows r > ref and k_s exp(Gam_ref - Gam_s) for s in block j, both
 * exponents <= 0 (Gam is non-increasing, exactly so in fp32 rounding).
 * Every matrix product goes through one warp-level 16 x 16 tile primitive
 * (Acc) with three implementations: tf32 tensor cores (default, fp32
 * accumulation), 3xTF32 (hi/lo split of both operands: fp32-accurate), and
 * plain fp32 FMA (the reference path). The triangular solve is fp32 FMA in
 * all three. Operands live in shared memory as fp32; state fp32 throughout.
 */
#include "cuda_common.cuh"
#include "kda_chunk.h"

#include <mma.h>
#include <type_traits>

using namespace nvcuda;

#define KC_CH 64     /* tokens per chunk */
#define KC_LDA 68    /* leading dimension of the 64 x 64 chunk matrices in shared memory */
#define KC_THREADS 256
#define KC_PREP_THREADS 512
#define KC_SMEM_SM 233472 /* shared memory per SM, sm_90 (228 KiB, 1 KiB of it reserved per block) */

/* ---- the workspace, resolved to device pointers ---- */
struct ChunkWs {
    int *nchunks, *status, *item_chunk0, *item_nchunks, *chunk_item, *chunk_local, *item_nseg, *item_seg0;
    float *q, *k, *v, *g, *beta, *aqk, *egl, *sc, *segx, *sstart, *ipart;
    int max_chunks, max_segs, seq_split, ipart_chunks;
};

/* Sequence split: an item of nc chunks gets min(seq_split, nc / KC_SEG_MIN)
 * segments (1: not split), so every segment has >= KC_SEG_MIN chunks and all
 * items together need at most max_segs segment buffers (T / 224 + 2 covers
 * every packing of <= T rows: a split item has > 7 * 64 rows). */
/* The intra stage in two launches (INTRA_PASS1, INTRA_FINISH below) by
 * default while a call has at most KC_ISPLIT_AUTO chunks x heads: then each
 * head's chunk runs on one SM of a mostly idle GPU, and the stage's length is
 * one block's serial chain. The workspace holds the slices' parts of L and
 * Aqk for up to KC_ISPLIT_CHUNK_HEADS (128 KiB each at K = 128). */
#define KC_ISPLIT_AUTO 256
#define KC_ISPLIT_CHUNK_HEADS 512

#define KC_SEG_MIN 4
#define KC_SEG_MAX 16

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" void kc_kda_chunk_layout_of(int T, int n_items, int H, int K, int V, int seq_split, kc_kda_chunk_layout *L)
{
    /* sum over items of ceil(ntok / 64) <= (T + 63 n_items) / 64 when the items tile <= T rows */
    const size_t maxc = ((size_t)T + 63 * (size_t)n_items) / KC_CH + 1;
    const size_t maxs = seq_split > 1 ? (size_t)T / 224 + 2 : 0;
    /* the intra split needs >= 2 K slices (K >= 64) */
    const size_t nks = K >= 64 ? (size_t)K / 32 : 0;
    const size_t ipc = nks ? (maxc < (size_t)KC_ISPLIT_CHUNK_HEADS / H ? maxc : (size_t)KC_ISPLIT_CHUNK_HEADS / H) : 0;
    const size_t rows = (size_t)H * T;
    size_t off = 0;
#define KC_PUT(field, bytes)                                                                       \
    do {                                                                                           \
        L->field = off;                                                                            \
        off = align256(off + (bytes));                                                             \
    } while (0)
    KC_PUT(plan_nchunks, 4);
    KC_PUT(status, 4);
    KC_PUT(item_chunk0, (size_t)n_items * 4);
    KC_PUT(item_nchunks, (size_t)n_items * 4);
    KC_PUT(item_nseg, (size_t)n_items * 4);
    KC_PUT(item_seg0, (size_t)n_items * 4);
    KC_PUT(chunk_item, maxc * 4);
    KC_PUT(chunk_local, maxc * 4);
    KC_PUT(q, rows * K * 4);
    KC_PUT(k, rows * K * 4);
    KC_PUT(v, rows * V * 4);
    KC_PUT(g, rows * K * 4);
    KC_PUT(beta, rows * 4);
    KC_PUT(aqk, rows * KC_CH * 4);
    KC_PUT(egl, maxc * H * K * 4);
    KC_PUT(sc, maxc * H * (size_t)K * V * 4);
    KC_PUT(segx, maxs * H * (size_t)K * (K + V) * 4);
    KC_PUT(sstart, maxs * H * (size_t)K * V * 4);
    KC_PUT(ipart, ipc * H * nks * 2 * KC_CH * KC_CH * 4);
#undef KC_PUT
    L->max_chunks = (int)maxc;
    L->max_segs = (int)maxs;
    L->ipart_chunks = (int)ipc;
    L->bytes = off;
}

extern "C" size_t kc_kda_chunk_workspace(int T, int n_items, int H, int K, int V)
{
    kc_kda_chunk_layout L;
    kc_kda_chunk_layout_of(T, n_items, H, K, V, 0, &L);
    return L.bytes;
}

extern "C" size_t kc_kda_chunk_workspace_split(int T, int n_items, int H, int K, int V, int seq_split)
{
    kc_kda_chunk_layout L;
    kc_kda_chunk_layout_of(T, n_items, H, K, V, seq_split, &L);
    return L.bytes;
}

extern "C" int kc_kda_chunk_supported(int H, int K, int V, int taps)
{
    const bool k_ok = K == 16 || K == 32 || K == 64 || K == 128;
    const bool v_ok = V == K || (V == 2 * K && K <= 64);
    return H >= 1 && k_ok && v_ok && taps >= 1 && taps <= 4;
}

/* ---- the 16 x 16 tile primitive ----
 * One warp owns one fp32 accumulator tile; mma() adds (neg ? -1 : 1) * A B
 * for A [16 x kdim] and B [kdim x 16] in shared memory (kdim % 8 == 0).
 * A_ROW: A(r, k) = A[r * lda + k], else A[k * lda + r];
 * B_ROW: B(k, c) = B[k * ldb + c], else B[c * ldb + k].
 * wmma needs 32-byte aligned tile pointers and ld % 4 == 0: every buffer
 * below starts at a multiple of 32 bytes, tiles at multiples of 8 rows and
 * 8 columns. All 32 lanes must call every member (warp-collective). */
template <int MODE> struct Acc {
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> f;
    __device__ __forceinline__ void zero() { wmma::fill_fragment(f, 0.0f); }
    __device__ __forceinline__ void load(const float *p, int ld) { wmma::load_matrix_sync(f, p, ld, wmma::mem_row_major); }
    __device__ __forceinline__ void store(float *p, int ld) const { wmma::store_matrix_sync(p, f, ld, wmma::mem_row_major); }
    /* += the tile at p (another warp's partial sum) */
    __device__ __forceinline__ void add(const float *p, int ld)
    {
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> t;
        wmma::load_matrix_sync(t, p, ld, wmma::mem_row_major);
#pragma unroll
        for (int i = 0; i < t.num_elements; i++) f.x[i] += t.x[i];
    }
    template <bool A_ROW, bool B_ROW>
    __device__ __forceinline__ void mma(const float *A, int lda, const float *B, int ldb, int kdim, bool neg)
    {
        typedef typename std::conditional<A_ROW, wmma::row_major, wmma::col_major>::type LA;
        typedef typename std::conditional<B_ROW, wmma::row_major, wmma::col_major>::type LB;
        for (int k0 = 0; k0 < kdim; k0 += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb;
            wmma::load_matrix_sync(fa, A_ROW ? A + k0 : A + (size_t)k0 * lda, lda);
            wmma::load_matrix_sync(fb, B_ROW ? B + (size_t)k0 * ldb : B + k0, ldb);
            if (MODE == KC_KDA_GEMM_TF32) {
#pragma unroll
                for (int t = 0; t < fa.num_elements; t++) fa.x[t] = wmma::__float_to_tf32(neg ? -fa.x[t] : fa.x[t]);
#pragma unroll
                for (int t = 0; t < fb.num_elements; t++) fb.x[t] = wmma::__float_to_tf32(fb.x[t]);
                wmma::mma_sync(f, fa, fb, f);
            } else { /* 3xTF32: a b ~= a_hi b_hi + a_hi b_lo + a_lo b_hi, small terms first */
                wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa_lo;
                wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb_lo;
#pragma unroll
                for (int t = 0; t < fa.num_elements; t++) {
                    const float x = neg ? -fa.x[t] : fa.x[t], hi = wmma::__float_to_tf32(x);
                    fa_lo.x[t] = wmma::__float_to_tf32(x - hi);
                    fa.x[t] = hi;
                }
#pragma unroll
                for (int t = 0; t < fb.num_elements; t++) {
                    const float x = fb.x[t], hi = wmma::__float_to_tf32(x);
                    fb_lo.x[t] = wmma::__float_to_tf32(x - hi);
                    fb.x[t] = hi;
                }
                wmma::mma_sync(f, fa_lo, fb, f);
                wmma::mma_sync(f, fa, fb_lo, f);
                wmma::mma_sync(f, fa, fb, f);
            }
        }
    }
};

/* plain fp32 FMA: lane l owns elements e = l + 32 i, row e / 16, column e % 16 */
template <> struct Acc<KC_KDA_GEMM_SIMT> {
    float x[8];
    __device__ __forceinline__ void zero()
    {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = 0.0f;
    }
    __device__ __forceinline__ void load(const float *p, int ld)
    {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = lane + 32 * i;
            x[i] = p[(e >> 4) * ld + (e & 15)];
        }
    }
    __device__ __forceinline__ void store(float *p, int ld) const
    {
        const int lane = threadIdx.x & 31;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = lane + 32 * i;
            p[(e >> 4) * ld + (e & 15)] = x[i];
        }
        __syncwarp();
    }
    __device__ __forceinline__ void add(const float *p, int ld)
    {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = lane + 32 * i;
            x[i] += p[(e >> 4) * ld + (e & 15)];
        }
    }
    template <bool A_ROW, bool B_ROW>
    __device__ __forceinline__ void mma(const float *A, int lda, const float *B, int ldb, int kdim, bool neg)
    {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int e = lane + 32 * i, r = e >> 4, c = e & 15;
            float s = 0.0f;
            for (int k = 0; k < kdim; k++) {
                const float av = A_ROW ? A[r * lda + k] : A[k * lda + r];
                const float bv = B_ROW ? B[k * ldb + c] : B[c * ldb + k];
                s += av * bv;
            }
            x[i] += neg ? -s : s;
        }
    }
};

/* mma.sync m16n8k8 with tf32 operands and fp32 accumulation, for the
 * recurrence, which keeps its state in the accumulators. Lane l = 4 g + t
 * holds A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); B(t, g),
 * B(t + 4, g); C(g, 2t), C(g, 2t + 1), C(g + 8, 2t), C(g + 8, 2t + 1)
 * (PTX ISA, "Matrix fragments for mma.m16n8k8", .tf32). Operands are tf32
 * bit patterns, rounded as cvt.rna.tf32.f32 does (ties away from zero). */
/* the bits of x as a To (same size); compiles to a register move */
template <class To, class From> static __device__ __forceinline__ To bit_cast(From x)
{
    static_assert(sizeof(To) == sizeof(From), "bit_cast between sizes");
    To r;
    memcpy(&r, &x, sizeof r);
    return r;
}
static __device__ __forceinline__ uint32_t tf32_round(float x)
{
#if defined(__CUDA_ARCH__)
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#else /* the emulator's cvt.rna (emu/mma.h) */
    return bit_cast<uint32_t>(wmma::__float_to_tf32(x));
#endif
}
static __device__ __forceinline__ float bits_f32(uint32_t u) { return bit_cast<float>(u); }
static __device__ __forceinline__ uint32_t f32_bits(float x) { return bit_cast<uint32_t>(x); }
/* c += A B (warp-collective) */
static __device__ __forceinline__ void mma_tf32_16x8x8(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#if defined(__CUDA_ARCH__)
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(KC_EMU)
    kc_emu_mma_m16n8k8(c, a, b);
#endif
}

/* The tf32 tile on mma.sync m16n8k8 (two n-halves of 8 columns), operands
 * read from shared memory by each lane in the PTX fragment layout and rounded
 * by cvt.rna, as wmma::__float_to_tf32 rounds them. Against wmma's
 * load_matrix_sync (generic 64-bit loads, one address per element) this
 * issues a shared load per element at a constant offset: in the intra stage
 * the fragment handling was ~a third of the kernel's instructions (ncu,
 * 1 x 2048). Lane 4 g + t holds C(g | g + 8, 8 j + 2 t | + 1) in c[j]. */
template <> struct Acc<KC_KDA_GEMM_TF32> {
    float c[2][4];
    __device__ __forceinline__ void zero()
    {
#pragma unroll
        for (int j = 0; j < 2; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.0f;
    }
    __device__ __forceinline__ void load(const float *p, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float2 lo = *(const float2 *)(p + g * ld + 8 * j + 2 * t), hi = *(const float2 *)(p + (g + 8) * ld + 8 * j + 2 * t);
            c[j][0] = lo.x, c[j][1] = lo.y, c[j][2] = hi.x, c[j][3] = hi.y;
        }
    }
    __device__ __forceinline__ void store(float *p, int ld) const
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 2; j++) {
            *(float2 *)(p + g * ld + 8 * j + 2 * t) = make_float2(c[j][0], c[j][1]);
            *(float2 *)(p + (g + 8) * ld + 8 * j + 2 * t) = make_float2(c[j][2], c[j][3]);
        }
        __syncwarp();
    }
    __device__ __forceinline__ void add(const float *p, int ld)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        __syncwarp();
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float2 lo = *(const float2 *)(p + g * ld + 8 * j + 2 * t), hi = *(const float2 *)(p + (g + 8) * ld + 8 * j + 2 * t);
            c[j][0] += lo.x, c[j][1] += lo.y, c[j][2] += hi.x, c[j][3] += hi.y;
        }
    }
    template <bool A_ROW, bool B_ROW>
    __device__ __forceinline__ void mma(const float *A, int lda, const float *B, int ldb, int kdim, bool neg)
    {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        /* A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); B(t, n), B(t + 4, n) for n = 8 j + g */
        const float *Ap = A_ROW ? A + g * lda + t : A + t * lda + g;
        const int a1 = A_ROW ? 8 * lda : 8, a2 = A_ROW ? 4 : 4 * lda, ak = A_ROW ? 8 : 8 * lda;
        const float *Bp = B_ROW ? B + t * ldb + g : B + g * ldb + t;
        const int b1 = B_ROW ? 4 * ldb : 4, bj = B_ROW ? 8 : 8 * ldb, bk = B_ROW ? 8 * ldb : 8;
        /* unrolled by 8 (4 left the recurrence at 80 registers with spills, ptxas -v):
         * the next steps' shared loads are issued before this step's mma
         * (ncu, 1 x 8192: the rolled loop waited on each load, and its address
         * arithmetic was the recurrence's largest instruction class); the products
         * still accumulate in k order */
#pragma unroll 8
        for (int k0 = 0; k0 < kdim; k0 += 8, Ap += ak, Bp += bk) {
            float x[4] = {Ap[0], Ap[a1], Ap[a2], Ap[a1 + a2]};
            uint32_t af[4];
#pragma unroll
            for (int i = 0; i < 4; i++) af[i] = tf32_round(neg ? -x[i] : x[i]);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const uint32_t bf[2] = {tf32_round(Bp[j * bj]), tf32_round(Bp[j * bj + b1])};
                mma_tf32_16x8x8(c[j], af, bf);
            }
        }
    }
};

static __device__ __forceinline__ int log2i(int x) /* x a power of two */
{
    int r = 0;
    while ((1 << r) < x) r++;
    return r;
}

/* The chunk a block of the per-chunk stages works on (block-uniform). */
struct ChunkPos {
    int item, chunk, n, row0; /* rows row0 .. row0 + n - 1, n in 1..64 */
};
static __device__ __forceinline__ bool chunk_pos(const kc_kda_chunk_args &a, const ChunkWs &w, int c, ChunkPos *p)
{
    if (c >= *w.nchunks) return false;
    const int item = w.chunk_item[c];
    if (item < 0) return false;
    const int cl = w.chunk_local[c];
    p->item = item;
    p->chunk = cl;
    p->n = min(KC_CH, a.item_ntok[item] - cl * KC_CH);
    p->row0 = a.item_row0[item] + cl * KC_CH;
    return true;
}

/* inclusive scan of x over the 1024 threads of the block; *total = the block's sum */
static __device__ int block_scan_1024(int x, int *wsum, int *total)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int v = wsum[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, v, o);
            if (lane >= o) v += y;
        }
        wsum[lane] = v;
    }
    __syncthreads();
    const int r = x + (warp ? wsum[warp - 1] : 0);
    *total = wsum[31];
    __syncthreads(); /* wsum free for the next scan */
    return r;
}

/* ---- plan: the chunk table ----
 * Item i gets ceil(ntok / 64) chunks if it is live (slot >= 0, ntok > 0) and
 * its rows lie in 0..T-1; an item that fails the row check, or whose chunks
 * would not fit the table, gets none (counted in status). Table entries of a
 * rejected item that fall inside the table say item -1 (skipped). With a
 * sequence split, its segments and their buffers (an item whose segments do
 * not fit the buffers runs unsplit). */
__global__ void __launch_bounds__(1024) kc_chunk_plan_kernel(kc_kda_chunk_args a, ChunkWs w)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    __shared__ int wsum[32];
    __shared__ int s_bad;
    const int tid = threadIdx.x;
    if (tid == 0) s_bad = 0;
    __syncthreads();
    int run = 0, srun = 0; /* chunks and segment buffers given to earlier tiles (same in every thread) */
    for (int base = 0; base < a.n_items; base += 1024) {
        const int i = base + tid;
        int nc = 0;
        if (i < a.n_items) {
            const int slot = a.item_slot[i], nt = a.item_ntok[i], r0 = a.item_row0[i];
            if (slot >= 0 && nt > 0) {
                if (r0 >= 0 && r0 <= a.T - nt)
                    nc = (nt + KC_CH - 1) / KC_CH;
                else
                    atomicAdd(&s_bad, 1);
            }
        }
        int total;
        const int c0 = run + block_scan_1024(nc, wsum, &total) - nc;
        const bool fits = c0 + nc <= w.max_chunks;
        if (nc > 0 && !fits) atomicAdd(&s_bad, 1);
        int nseg = 1;
        if (fits && w.seq_split > 1) nseg = min(w.seq_split, nc / KC_SEG_MIN);
        if (nseg < 2) nseg = 1;
        int stotal;
        const int sg0 = srun + block_scan_1024(nseg > 1 ? nseg : 0, wsum, &stotal) - (nseg > 1 ? nseg : 0);
        if (nseg > 1 && sg0 + nseg > w.max_segs) nseg = 1;
        if (i < a.n_items) {
            w.item_chunk0[i] = c0;
            w.item_nchunks[i] = fits ? nc : 0;
            w.item_nseg[i] = nseg;
            w.item_seg0[i] = sg0;
            for (int c = 0; c < nc && c0 + c < w.max_chunks; c++) {
                w.chunk_item[c0 + c] = fits ? i : -1;
                w.chunk_local[c0 + c] = c;
            }
        }
        run += total, srun += stotal;
    }
    __syncthreads();
    if (tid == 0) {
        *w.nchunks = min(run, w.max_chunks);
        *w.status = s_bad;
    }
}

/* exp through ex2.approx (__expf) on the GPU; the emulator runs the accurate
 * expf: the GPU test checks the difference */
static __device__ __forceinline__ float kc_fexp(float x)
{
#if defined(__CUDA_ARCH__)
    return __expf(x);
#else
    return expf(x);
#endif
}

/* SiLU through __expf and __fdividef (for x < -88 the quotient is 0, as it
 * should be to fp32); the emulator divides exactly */
static __device__ __forceinline__ float silu_fast(float x)
{
#if defined(__CUDA_ARCH__)
    return __fdividef(x, 1.0f + __expf(-x));
#else
    return x / (1.0f + expf(-x));
#endif
}

/* ---- prep: block per (chunk, head, part) with part 0 = q, 1 = k, 2 = v ----
 * Thread (group gq, channel ch) computes rows gq RPG .. (gq + 1) RPG - 1 of
 * channel ch: G = min(8, 512 / width) row groups of RPG = 64 / G rows, so
 * that one warp's serial chain (conv, SiLU and the gate's softplus per row:
 * ~100 instructions a row) is 8-16 rows long, not 64: the stage is bound by
 * that chain when the chunks are few (one 64-token item: 48 blocks). Each
 * thread's conv window starts from the three raw inputs before its rows
 * (earlier rows of the item, or the slot's conv tail). q and k rows are
 * staged in shared memory for their L2 norm; the k blocks also produce Gam,
 * the running sum of the gate over the chunk's rows: each group sums its own
 * rows, then adds the totals of the groups before it, left to right, so the
 * first row of a group gets exactly the last row's Gam of the group before
 * plus its own (non-positive) term and Gam stays non-increasing in fp32. */
__global__ void __launch_bounds__(KC_PREP_THREADS, 2) kc_chunk_prep_kernel(kc_kda_chunk_args a, ChunkWs w)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    ChunkPos cp;
    if (!chunk_pos(a, w, blockIdx.x, &cp)) return;
    const int h = blockIdx.y, part = blockIdx.z;
    const int H = a.H, K = a.K, V = a.V, HK = H * K, HV = H * V, Cc = 2 * HK + HV, P = a.taps - 1, sh = 3 - P;
    const size_t T = a.T;
    const int irow0 = a.item_row0[cp.item], p0 = cp.chunk * KC_CH, n = cp.n, row0 = cp.row0;
    const float *tail = a.state + (size_t)a.item_slot[cp.item] * a.slot_stride + kc_tail_off(H, K, V, a.state_bf16); /* [P, Cc] */
    const int width = part == 2 ? V : K, wsh = log2i(width); /* width <= 128, a power of two */
    const int G = min(8, KC_PREP_THREADS >> wsh), RPG = KC_CH / G;
    const int colb = part == 0 ? h * K : part == 1 ? HK + h * K : 2 * HK + h * V;
    KC_DYNAMIC_SMEM(x_s); /* [64][K] (parts 0, 1) */
    __shared__ float inv_s[KC_CH];
    __shared__ float gtot_s[8][128]; /* part 1: each group's sum of its rows' gate terms */
    float *dst = (part == 0 ? w.q : part == 1 ? w.k : w.v) + ((size_t)h * T + row0) * width;
    const float a_h = -expf(a.A_log[h]);
    const int ch = threadIdx.x & (width - 1), gq = threadIdx.x >> wsh;
    const int r0 = gq * RPG, col = colb + ch;
    const bool active = gq < G && r0 < n; /* a group past the chunk's rows reads nothing */
    float gv[16]; /* this thread's rows of Gam before the offset of the groups before it */
    float gacc = 0.0f;
    if (active) {
        /* taps right-aligned in 4 weights (leading zeros for taps < 4);
         * xw = raw inputs at positions p - 3, p - 2, p - 1 of the item */
        float wt[4], xw[3];
#pragma unroll
        for (int i = 0; i < 4; i++) wt[i] = i >= sh ? a.convw[(size_t)col * a.taps + (i - sh)] : 0.0f;
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const int pos = p0 + r0 - 3 + i;
            xw[i] = pos >= 0 ? a.proj[(size_t)(irow0 + pos) * a.ldp + col]
                  : pos >= -P ? tail[(size_t)(P + pos) * Cc + col] : 0.0f;
        }
        const float dtb = part == 1 ? a.dt_bias[h * K + ch] : 0.0f;
#pragma unroll
        for (int u0 = 0; u0 < 16; u0 += 8) {
            if (u0 < RPG) {
                float xb[8], gb[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int r = r0 + u0 + u;
                    xb[u] = r < n ? a.proj[(size_t)(row0 + r) * a.ldp + col] : 0.0f;
                    gb[u] = part == 1 && r < n ? a.lowrank[(size_t)(row0 + r) * (HK + HV) + h * K + ch] : 0.0f;
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int r = r0 + u0 + u;
                    if (r < n) {
                        const float s = ((wt[0] * xw[0] + wt[1] * xw[1]) + wt[2] * xw[2]) + wt[3] * xb[u];
                        xw[0] = xw[1], xw[1] = xw[2], xw[2] = xb[u];
                        const float y = silu_fast(s);
                        if (part == 2)
                            dst[(size_t)r * V + ch] = y;
                        else
                            x_s[r * K + ch] = y;
                        if (part == 1) gacc += a_h * softplusf_(gb[u] + dtb);
                    }
                    gv[u0 + u] = gacc;
                }
            }
        }
    }
    if (part == 1) {
        if (active) gtot_s[gq][ch] = gacc;
        for (int r = threadIdx.x; r < n; r += KC_PREP_THREADS)
            w.beta[(size_t)h * T + row0 + r] = sigmoidf_(a.proj[(size_t)(row0 + r) * a.ldp + a.off_beta + h]);
        __syncthreads();
        if (active) {
            float off = 0.0f;
            for (int s = 0; s < gq; s++) off += gtot_s[s][ch];
#pragma unroll
            for (int u = 0; u < 16; u++) {
                const int r = r0 + u;
                if (u < RPG && r < n) w.g[((size_t)h * T + row0 + r) * K + ch] = gq ? off + gv[u] : gv[u];
            }
        }
    }
    if (part == 2) return;
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < n; r += KC_PREP_THREADS / 32) {
        float ss = 0.0f;
        for (int c = lane; c < K; c += 32) ss += x_s[r * K + c] * x_s[r * K + c];
        ss = warp_sum(ss);
        if (lane == 0) inv_s[r] = 1.0f / sqrtf(ss + 1e-6f);
    }
    __syncthreads();
    const float scale = part == 0 ? 1.0f / sqrtf((float)K) : 1.0f;
    const int kshift = log2i(K);
    for (int e = threadIdx.x; e < n * K; e += KC_PREP_THREADS) dst[e] = x_s[e] * inv_s[e >> kshift] * scale;
}

/* ---- intra: block per (chunk, head) ----
 * Shared memory (floats), in two regions so that three blocks fit an SM:
 *   Ai [64][68], beta [64];
 *   region Y, in turn: the k, q, Gam slices [64][BK+4] (BK = min(K, 32)
 *   channels at a time) and scratch [112][BK+4] (the two factors of the
 *   off-diagonal sub-blocks; later the right-hand sides [64][BK+8]); after
 *   pass 1, L and Aqk [64][68] and the solve's products [768].
 * The off-diagonal sub-blocks of L and Aqk accumulate over the K slices in
 * registers (12 tiles, <= 2 per warp) and the diagonal ones per thread, so
 * neither matrix lives in shared memory while the slices do. BK is a
 * template parameter: the kernel is bound by its instruction issue, so
 * index arithmetic is shifts and loads are 16 bytes wide. Exponentials of
 * non-positive arguments through __expf (ex2.approx: relative error ~1e-6
 * where the result is not negligible, far under the tf32 products it feeds;
 * the stage-2 test of qg and kg at 1e-5 covers it). */
static __host__ __device__ int intra_region_y(int BK)
{
    const int a = 3 * KC_CH * (BK + 4) + 112 * (BK + 4), b = 2 * KC_CH * KC_LDA + 768;
    return a > b ? a : b;
}
static __host__ __device__ int intra_smem_floats(int K)
{
    return KC_CH * KC_LDA + KC_CH + intra_region_y(K < 32 ? K : 32);
}


/* What an intra block does (the template's PART): the whole stage, or for
 * few chunks (short prompts: one chunk's serial chain per head on 16 SMs)
 * the same work spread over more blocks in two launches:
 *   INTRA_PASS1  block per (chunk, head, K slice z): pass 1 over slice z
 *                only; its contributions to L and Aqk go to the workspace
 *                (ipart[chunk][head][z]);
 *   INTRA_FINISH block per (chunk, head, z < K/BK + V/BK): L and Aqk as the
 *                sum of the slices' parts (in slice order), the solve
 *                (repeated by every block of the chunk), then W, qg, kg for
 *                K slice z (z < K/BK) or U for value slice z - K/BK.
 * The launch boundary between the two is what lets pass 2 overwrite q, k and
 * Gam in place while other blocks of the chunk read them in pass 1. */
enum { INTRA_FUSED, INTRA_PASS1, INTRA_FINISH };

template <int MODE, int BK, int PART>
__global__ void __launch_bounds__(KC_THREADS, MODE == KC_KDA_GEMM_TF32 ? 3 : 1)
    kc_chunk_intra_kernel(kc_kda_chunk_args a, ChunkWs w)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    ChunkPos cp;
    if (!chunk_pos(a, w, blockIdx.x, &cp)) return;
    constexpr int LDS = BK + 4, LDR = BK + 8, B4 = BK / 4, B4SH = BK == 16 ? 2 : 3, BSH = BK == 16 ? 4 : 5;
    static_assert(BK == 16 || BK == 32, "slice width");
    const int h = blockIdx.y, n = cp.n, row0 = cp.row0;
    const int K = a.K, V = a.V, nks = K / BK, nvs = V / BK, z = blockIdx.z;
    const size_t T = a.T;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* the chunk's slice parts of L and Aqk: [nks][2][64][64] */
    float *ipart = w.ipart + ((size_t)blockIdx.x * a.H + h) * nks * 2 * KC_CH * KC_CH;
    KC_DYNAMIC_SMEM(sm);
    float *Ai_s = sm, *beta_s = Ai_s + KC_CH * KC_LDA, *Y = beta_s + KC_CH;
    float *k_s = Y, *q_s = k_s + KC_CH * LDS, *g_s = q_s + KC_CH * LDS;
    float *ka = g_s + KC_CH * LDS, *qa = ka + 48 * LDS, *kb = qa + 48 * LDS; /* ka..qa: 96 rows */
    float *L_s = Y, *A_s = L_s + KC_CH * KC_LDA, *tmp = A_s + KC_CH * KC_LDA; /* after pass 1 */
    const float *kin = w.k + ((size_t)h * T + row0) * K, *qin = w.q + ((size_t)h * T + row0) * K;
    const float *gin = w.g + ((size_t)h * T + row0) * K;

    /* Ai's blocks above the diagonal stay zero (W and U read the whole matrix) */
    if (PART != INTRA_PASS1) {
        for (int e = tid; e < KC_CH * KC_LDA / 4; e += KC_THREADS) ((float4 *)Ai_s)[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int r = tid; r < KC_CH; r += KC_THREADS) beta_s[r] = r < n ? w.beta[(size_t)h * T + row0 + r] : 0.0f;
    }
    /* rows >= n: k = q = 0 and Gam = Gam[n-1], so they add nothing and every
     * exponent stays <= 0 */
    /* every load of the slice is issued before the first store (ncu, 1 x 8192:
     * load-store pairs in turn left the block waiting on each) */
    static_assert((KC_CH * (32 / 4)) % KC_THREADS == 0 && (KC_CH * (16 / 4)) % KC_THREADS == 0, "whole rows");
    auto load_slice = [&](int ks) {
        for (int e = tid; e < KC_CH * B4; e += KC_THREADS) {
            const int r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            const size_t o = (size_t)(r < n ? r : n - 1) * K + ks * BK + d;
            const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            *(float4 *)(k_s + r * LDS + d) = r < n ? *(const float4 *)(kin + o) : z;
            *(float4 *)(q_s + r * LDS + d) = r < n ? *(const float4 *)(qin + o) : z;
            *(float4 *)(g_s + r * LDS + d) = *(const float4 *)(gin + o);
        }
    };

    /* diagonal sub-blocks: 4 x 136 pairs (r, s), s <= r within a block, up
     * to 3 per thread, accumulated over the K slices in registers */
    int pr[3], ps[3];
    float dk[3] = {0.0f, 0.0f, 0.0f}, dq[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 3; i++) {
        const int p = tid + KC_THREADS * i;
        pr[i] = ps[i] = -1;
        if (p < 4 * 136) {
            int l = p % 136, r = 0;
            while (l > r) l -= r + 1, r++;
            pr[i] = 16 * (p / 136) + r;
            ps[i] = 16 * (p / 136) + l;
        }
    }
    /* The 12 off-diagonal tiles (column block j, row tile mi below it, of L
     * or Aqk), at most two per warp and those of one j on different warps:
     * j = 0 (6 tiles) on warps 0..5 (slot 0), j = 1 (4) on warps 6, 7, 0, 1
     * and j = 2 (2) on warps 2, 3 (slot 1). */
    Acc<MODE> acc0, acc1;
    acc0.zero();
    acc1.zero();
    const bool has0 = warp < 6, isq0 = warp >= 3;
    const int mi0 = warp % 3;
    const int j1 = warp >= 6 || warp < 2 ? 1 : warp < 4 ? 2 : -1;
    const int u1 = j1 == 1 ? (warp + 2) & 7 : warp - 2; /* j1 = 1: 0..3; j1 = 2: 0..1 */
    const bool isq1 = j1 == 1 ? u1 >= 2 : u1 == 1;
    const int mi1 = j1 == 1 ? (u1 & 1) : 0;

    /* pass 1: L (before beta) and Aqk */
    const int p1_lo = PART == INTRA_PASS1 ? z : 0, p1_hi = PART == INTRA_PASS1 ? z + 1 : PART == INTRA_FUSED ? nks : 0;
    for (int ks = p1_lo; ks < p1_hi; ks++) {
        load_slice(ks);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 3; i++) {
            if (pr[i] < 0) continue;
            const float *kr = k_s + pr[i] * LDS, *qr = q_s + pr[i] * LDS, *gr = g_s + pr[i] * LDS;
            const float *ks_ = k_s + ps[i] * LDS, *gs = g_s + ps[i] * LDS;
            float sk = 0.0f, sq = 0.0f;
#pragma unroll
            for (int d = 0; d < BK; d += 4) {
                const float4 k4 = *(const float4 *)(ks_ + d), g4 = *(const float4 *)(gs + d);
                const float4 gr4 = *(const float4 *)(gr + d), kr4 = *(const float4 *)(kr + d), qr4 = *(const float4 *)(qr + d);
                const float e0 = k4.x * kc_fexp(gr4.x - g4.x), e1 = k4.y * kc_fexp(gr4.y - g4.y);
                const float e2 = k4.z * kc_fexp(gr4.z - g4.z), e3 = k4.w * kc_fexp(gr4.w - g4.w);
                sk += kr4.x * e0 + kr4.y * e1 + kr4.z * e2 + kr4.w * e3;
                sq += qr4.x * e0 + qr4.y * e1 + qr4.z * e2 + qr4.w * e3;
            }
            dk[i] += sk;
            dq[i] += sq;
        }
        for (int j = 0; j < 3; j++) {
            const int R0 = 16 * (j + 1), M = KC_CH - R0;
            const float *gref = g_s + (16 * j + 15) * LDS;
            for (int e = tid; e < M * BK; e += KC_THREADS) {
                const int i = e >> BSH, d = e & (BK - 1);
                const float x = kc_fexp(g_s[(R0 + i) * LDS + d] - gref[d]);
                ka[i * LDS + d] = k_s[(R0 + i) * LDS + d] * x;
                qa[i * LDS + d] = q_s[(R0 + i) * LDS + d] * x;
            }
            for (int e = tid; e < 16 * BK; e += KC_THREADS) {
                const int s = e >> BSH, d = e & (BK - 1);
                kb[s * LDS + d] = k_s[(16 * j + s) * LDS + d] * kc_fexp(gref[d] - g_s[(16 * j + s) * LDS + d]);
            }
            __syncthreads();
            if (j == 0 && has0)
                acc0.template mma<true, false>((isq0 ? qa : ka) + 16 * mi0 * LDS, LDS, kb, LDS, BK, false);
            if (j > 0 && j1 == j)
                acc1.template mma<true, false>((isq1 ? qa : ka) + 16 * mi1 * LDS, LDS, kb, LDS, BK, false);
            __syncthreads(); /* the factors and (last j) the slices are free */
        }
    }
    /* L and Aqk into region Y (the slices are dead): zeros above the
     * diagonal of Aqk (stored whole), the tiles, the diagonal sub-blocks.
     * L's entries on and above the diagonal are never read. */
    if (PART != INTRA_FINISH) {
        for (int e = tid; e < KC_CH * KC_LDA / 4; e += KC_THREADS) ((float4 *)A_s)[e] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        __syncthreads();
        if (has0) acc0.store((isq0 ? A_s : L_s) + (16 + 16 * mi0) * KC_LDA, KC_LDA);
        if (j1 > 0) acc1.store((isq1 ? A_s : L_s) + (16 * (j1 + 1) + 16 * mi1) * KC_LDA + 16 * j1, KC_LDA);
#pragma unroll
        for (int i = 0; i < 3; i++) {
            if (pr[i] < 0) continue;
            if (ps[i] < pr[i]) L_s[pr[i] * KC_LDA + ps[i]] = dk[i];
            A_s[pr[i] * KC_LDA + ps[i]] = dq[i];
        }
        __syncthreads();
    }
    if (PART == INTRA_PASS1) { /* this slice's part, for the finishing blocks */
        float *pl = ipart + (size_t)z * 2 * KC_CH * KC_CH, *pq = pl + KC_CH * KC_CH;
        for (int e = tid; e < KC_CH * KC_CH / 4; e += KC_THREADS) {
            const int r = e >> 4, c = (e & 15) * 4;
            *(float4 *)(pl + r * KC_CH + c) = *(const float4 *)(L_s + r * KC_LDA + c);
            *(float4 *)(pq + r * KC_CH + c) = *(const float4 *)(A_s + r * KC_LDA + c);
        }
        return;
    }
    if (PART == INTRA_FINISH) { /* the sum of the slices' parts, slice 0 first */
        for (int e = tid; e < KC_CH * KC_CH / 4; e += KC_THREADS) {
            const int r = e >> 4, c = (e & 15) * 4;
            float4 l = *(const float4 *)(ipart + r * KC_CH + c), q = *(const float4 *)(ipart + KC_CH * KC_CH + r * KC_CH + c);
            for (int sl = 1; sl < nks; sl++) {
                const float *pl = ipart + (size_t)sl * 2 * KC_CH * KC_CH + r * KC_CH + c;
                const float4 l2 = *(const float4 *)pl, q2 = *(const float4 *)(pl + KC_CH * KC_CH);
                l.x += l2.x, l.y += l2.y, l.z += l2.z, l.w += l2.w;
                q.x += q2.x, q.y += q2.y, q.z += q2.z, q.w += q2.w;
            }
            *(float4 *)(L_s + r * KC_LDA + c) = l;
            *(float4 *)(A_s + r * KC_LDA + c) = q;
        }
        __syncthreads();
    }
    for (int e = tid; e < KC_CH * KC_CH; e += KC_THREADS) L_s[(e >> 6) * KC_LDA + (e & 63)] *= beta_s[e >> 6];
    for (int e = tid; e < (PART == INTRA_FUSED || z == 0 ? n : 0) * (KC_CH / 4); e += KC_THREADS)
        *(float4 *)(w.aqk + ((size_t)h * T + row0 + (e >> 4)) * KC_CH + (e & 15) * 4) =
            *(const float4 *)(A_s + (e >> 4) * KC_LDA + (e & 15) * 4);
    __syncthreads();

    /* Ai = (I + L)^-1. Diagonal blocks: forward substitution, lane c of
     * warps 0..3 holds column c of block `warp` in registers. */
    if (warp < 4 && lane < 16) {
        const int b = warp, col = lane;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float v = r == col ? 1.0f : 0.0f;
#pragma unroll
            for (int s = 0; s < r; s++) v -= L_s[(16 * b + r) * KC_LDA + 16 * b + s] * x[s];
            x[r] = v;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) Ai_s[(16 * b + r) * KC_LDA + 16 * b + col] = x[r];
    }
    __syncthreads();
    /* Off-diagonal blocks by distance from the diagonal:
     * Ai_ij = -Ai_ii sum_{m=j}^{i-1} L_im Ai_mj (every Ai_mj is nearer). */
    for (int dist = 1; dist < 4; dist++) {
        const int np = 4 - dist;
        for (int e = tid; e < np * 256; e += KC_THREADS) {
            const int i = dist + e / 256, j = i - dist, rr = (e >> 4) & 15, cc = e & 15;
            float s = 0.0f;
            for (int m = j; m < i; m++)
#pragma unroll
                for (int t = 0; t < 16; t++)
                    s += L_s[(16 * i + rr) * KC_LDA + 16 * m + t] * Ai_s[(16 * m + t) * KC_LDA + 16 * j + cc];
            tmp[e] = s;
        }
        __syncthreads();
        for (int e = tid; e < np * 256; e += KC_THREADS) {
            const int i = dist + e / 256, j = i - dist, rr = (e >> 4) & 15, cc = e & 15;
            float s = 0.0f;
#pragma unroll
            for (int t = 0; t < 16; t++) s += Ai_s[(16 * i + rr) * KC_LDA + 16 * i + t] * tmp[(e & ~255) + t * 16 + cc];
            Ai_s[(16 * i + rr) * KC_LDA + 16 * j + cc] = -s;
        }
        __syncthreads();
    }

    /* pass 2, per K slice (region Y holds the slices again: L and Aqk are
     * dead): qg, kg, exp(Gam_last) out; W = Ai (beta k exp(Gam)). The
     * right-hand sides (a row-major B operand) at ld = BK + 8: no bank conflicts. */
    float *rhs = ka;   /* [64][LDR] (<= 112 x LDS) */
    float *stage = q_s; /* product tile staging, free once qg is out */
    constexpr int nct = BK / 16;
    const int p2_lo = PART == INTRA_FINISH ? min(z, nks) : 0, p2_hi = PART == INTRA_FINISH ? min(z + 1, nks) : nks;
    for (int ks = p2_lo; ks < p2_hi; ks++) {
        load_slice(ks);
        __syncthreads();
        const float *glast = g_s + (n - 1) * LDS;
        for (int e = tid; e < KC_CH * B4; e += KC_THREADS) {
            const int r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            const float4 gv = *(const float4 *)(g_s + r * LDS + d), kv = *(const float4 *)(k_s + r * LDS + d);
            const float4 qv = *(const float4 *)(q_s + r * LDS + d), gl = *(const float4 *)(glast + d);
            const float4 eg = make_float4(kc_fexp(gv.x), kc_fexp(gv.y), kc_fexp(gv.z), kc_fexp(gv.w));
            const float b = beta_s[r];
            *(float4 *)(rhs + r * LDR + d) = make_float4(b * kv.x * eg.x, b * kv.y * eg.y, b * kv.z * eg.z, b * kv.w * eg.w);
            if (r < n) {
                const size_t o = ((size_t)h * T + row0 + r) * K + ks * BK + d;
                *(float4 *)(w.q + o) = make_float4(qv.x * eg.x, qv.y * eg.y, qv.z * eg.z, qv.w * eg.w);
                *(float4 *)(w.k + o) = make_float4(kv.x * kc_fexp(gl.x - gv.x), kv.y * kc_fexp(gl.y - gv.y),
                                                   kv.z * kc_fexp(gl.z - gv.z), kv.w * kc_fexp(gl.w - gv.w));
            }
        }
        if (tid < BK) w.egl[((size_t)blockIdx.x * a.H + h) * K + ks * BK + tid] = expf(glast[tid]);
        __syncthreads();
        if (warp < 4 * nct) {
            const int mi = warp / nct, ni = warp % nct;
            Acc<MODE> acc;
            acc.zero();
            acc.template mma<true, true>(Ai_s + 16 * mi * KC_LDA, KC_LDA, rhs + 16 * ni, LDR, KC_CH, false);
            acc.store(stage + 16 * mi * LDS + 16 * ni, LDS);
        }
        __syncthreads();
        for (int e = tid; e < n * B4; e += KC_THREADS) {
            const int r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            *(float4 *)(w.g + ((size_t)h * T + row0 + r) * K + ks * BK + d) = *(const float4 *)(stage + r * LDS + d);
        }
        __syncthreads();
    }
    /* U = Ai (beta v), BK value columns at a time, in place of v */
    const int u_lo = PART == INTRA_FINISH ? max(z - nks, 0) : 0, u_hi = PART == INTRA_FINISH ? max(z - nks + 1, 0) : nvs;
    /* slice vs + 1 of v is loaded into registers while slice vs's product runs
     * (ncu, 1 x 8192: the block waited on these loads at every slice) */
    constexpr int NLV = KC_CH * B4 / KC_THREADS;
    float4 vpre[NLV];
    auto load_v = [&](int vs) {
        const float *vin = w.v + ((size_t)h * T + row0) * V + vs * BK;
#pragma unroll
        for (int i = 0; i < NLV; i++) {
            const int e = tid + i * KC_THREADS, r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            vpre[i] = r < n ? *(const float4 *)(vin + (size_t)r * V + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    if (u_lo < u_hi) load_v(u_lo);
    for (int vs = u_lo; vs < u_hi; vs++) {
        float *vio = w.v + ((size_t)h * T + row0) * V + vs * BK;
#pragma unroll
        for (int i = 0; i < NLV; i++) {
            const int e = tid + i * KC_THREADS, r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            const float b = r < n ? beta_s[r] : 0.0f;
            const float4 v4 = vpre[i];
            *(float4 *)(rhs + r * LDR + d) = r < n ? make_float4(b * v4.x, b * v4.y, b * v4.z, b * v4.w)
                                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        __syncthreads();
        if (vs + 1 < u_hi) load_v(vs + 1); /* other columns than the stores below */
        if (warp < 4 * nct) {
            const int mi = warp / nct, ni = warp % nct;
            Acc<MODE> acc;
            acc.zero();
            acc.template mma<true, true>(Ai_s + 16 * mi * KC_LDA, KC_LDA, rhs + 16 * ni, LDR, KC_CH, false);
            acc.store(stage + 16 * mi * LDS + 16 * ni, LDS);
        }
        __syncthreads();
        for (int e = tid; e < n * B4; e += KC_THREADS) {
            const int r = e >> B4SH, d = (e & (B4 - 1)) * 4;
            *(float4 *)(vio + (size_t)r * V + d) = *(const float4 *)(stage + r * LDS + d);
        }
        __syncthreads();
    }
}

/* ---- recur ----
 * A block walks chunks [c0, c1) of one item for one head with BV columns of
 * a K x BV matrix X in shared memory: per chunk X <- diag(exp(Gam_last)) X +
 * kg^T (U - W X). With X = the state's value columns that is the
 * recurrence; with U = 0 and X starting as columns of the identity, X ends
 * as the chunks' transition matrix M (S_end = M S_start + B): the sequence
 * split below. What a block does is its job: */
enum { RJ_SLOT, RJ_IDENT, RJ_ZERO, RJ_SSTART };     /* start of X */
enum { RJ_END_NONE, RJ_END_SLOT, RJ_END_SEGX };    /* where the final X goes */
struct RecurJob {
    int c0, c1;   /* chunk range within the item */
    int vcol;     /* first value column (U, Vnew, state), or -1: identity columns mcol.. (U = 0) */
    int mcol;
    int start, end;
    int seg;      /* segment buffer index (RJ_SSTART, RJ_END_SEGX) */
    int xcol;     /* first column in the segment buffer's K + V columns */
    bool out;     /* store X at each chunk start and Vnew (for the output stage) */
};

/* Segment s of an item with nc chunks in nseg segments: chunks [s nc / nseg, (s+1) nc / nseg). */
static __device__ __forceinline__ int seg_c0(int s, int nc, int nseg) { return (int)((long)s * nc / nseg); }

/* phase 0: no split, z = value block. phase 1 (split): z = aug block + (K+V)/BV * segment:
 * segment 0 runs from the slot's state with outputs, segments >= 1 compute their
 * [M | B] from [I | 0]; items with one segment run whole. phase 2 (split, after
 * the combine): z = value block + V/BV * (segment - 1), from the true segment
 * start, with outputs. */
static __device__ bool recur_job(const kc_kda_chunk_args &a, const ChunkWs &w, int phase, int BV, int write_state,
                                 RecurJob *j)
{
    const int item = blockIdx.x, nc = w.item_nchunks[item];
    if (nc == 0) return false;
    const int K = a.K, V = a.V, nvb = V / BV, nmb = K / BV;
    const int nseg = phase == 0 ? 1 : w.item_nseg[item];
    j->c0 = 0, j->c1 = nc, j->mcol = 0, j->seg = 0, j->xcol = 0;
    j->start = RJ_SLOT, j->end = write_state ? RJ_END_SLOT : RJ_END_NONE, j->out = true;
    if (phase == 0) {
        j->vcol = blockIdx.z * BV;
        return true;
    }
    if (phase == 2) {
        const int vb = blockIdx.z % nvb, s = 1 + blockIdx.z / nvb;
        if (nseg < 2 || s >= nseg) return false;
        j->vcol = vb * BV, j->c0 = seg_c0(s, nc, nseg), j->c1 = seg_c0(s + 1, nc, nseg);
        j->start = RJ_SSTART, j->seg = w.item_seg0[item] + s, j->end = RJ_END_NONE;
        return true;
    }
    const int cb = blockIdx.z % (nmb + nvb), s = blockIdx.z / (nmb + nvb);
    if (s >= nseg) return false;
    if (nseg == 1) { /* not split: the whole item */
        if (cb < nmb) return false;
        j->vcol = (cb - nmb) * BV;
        return true;
    }
    j->c0 = seg_c0(s, nc, nseg), j->c1 = seg_c0(s + 1, nc, nseg);
    j->seg = w.item_seg0[item] + s, j->end = RJ_END_SEGX, j->xcol = cb * BV;
    if (s == 0) {
        if (cb < nmb) return false;
        j->vcol = (cb - nmb) * BV;
        return true;
    }
    j->out = false;
    if (cb < nmb)
        j->vcol = -1, j->mcol = cb * BV, j->start = RJ_IDENT;
    else
        j->vcol = (cb - nmb) * BV, j->start = RJ_ZERO;
    return true;
}

/* Shared memory (floats): X [K][LDV], Vnew [64][LDV], then nbuf (1 or 2)
 * buffers of { W [64][K+4], kg [64][K+8], U [64][LDV], exp(Gam_last) [K] }.
 * With 2, chunk c + 1's loads (cp.async) are in flight while chunk c
 * computes; with 1, a second block on the SM (half the shared memory) hides them.
 * Strides against bank conflicts of the fragment loads: a row-major A operand
 * (W) wants ld = 4 mod 32, a col-major A (kg^T) and a row-major B (X, Vnew)
 * ld = 8 mod 32 (BV = 64 keeps +4 so that two buffers fit). */
static __host__ __device__ int recur_ldv(int BV) { return BV + (BV < 64 ? 8 : 4); }
static __host__ __device__ int recur_smem_floats(int K, int BV, int nbuf)
{
    const int LDV = recur_ldv(BV);
    return (K + KC_CH) * LDV + nbuf * (KC_CH * (K + 4) + KC_CH * (K + 8) + KC_CH * LDV + K);
}

/* The chunk pipeline both recurrence walks share: with two buffers, chunk ci + 1's
 * loads are issued before chunk ci's are waited for; with one, chunk ci's are issued
 * now (the walk's first before it starts). Returns the buffer holding chunk ci; the
 * caller's __syncthreads makes everyone's copies visible. */
template <class Issue>
static __device__ __forceinline__ int recur_wait_chunk(int ci, int c0, int c1, int nbuf, Issue &issue)
{
    if (nbuf == 2) {
        const int b = (ci - c0) & 1;
        if (ci + 1 < c1) issue(ci + 1, b ^ 1);
        cp_async_commit();
        cp_async_wait<1>(); /* this thread's copies of chunk ci have landed */
        return b;
    }
    if (ci > c0) issue(ci, 0), cp_async_commit();
    cp_async_wait<0>();
    return 0;
}

/* The chunk walk of the tf32 recurrence on mma.sync, the state in registers:
 * warp w holds S's row tile w / swp (16 rows) and sncw of its 8-column
 * tiles as fp32 accumulators for the whole walk, and a tf32 copy in X_s is
 * the B operand of Vnew = U - W X. Per chunk: Vnew (warp w: row tile w % 4,
 * half the column tiles) from W and X_s; Vnew to Vn_s (tf32, the B operand
 * of the update) and to the workspace (fp32); the chunk's start state from
 * the registers to the workspace; X = diag(exp(Gam_last)) X + kg^T Vnew in
 * the registers, then its tf32 copy to X_s. On entry X_s holds the start
 * state (fp32), on exit the final state (fp32). The operands are the tf32
 * roundings the wmma path makes, so the two agree to accumulation order. */
template <class Issue>
static __device__ __forceinline__ void recur_chunks_mma(const kc_kda_chunk_args &a, const ChunkWs &w, const RecurJob &jb,
                                                        int BV, int nbuf, float *X_s, float *Vn_s, float *buf0,
                                                        int bufsz, Issue &issue)
{
    const int item = blockIdx.x, h = blockIdx.y;
    const int gc0 = w.item_chunk0[item], irow0 = a.item_row0[item], nt = a.item_ntok[item];
    const int H = a.H, K = a.K, V = a.V, LDK = K + 4, LDG = K + 8, LDV = recur_ldv(BV);
    const size_t T = a.T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int RT = K >> 4, CT = BV >> 3;              /* 16-row and 8-column tiles of the state */
    const int swp = min(8 / RT, CT), sncw = CT / swp; /* warps per row tile, column tiles per warp (<= 8) */
    const bool s_on = warp < RT * swp;
    const int srt = warp / swp, sct0 = (warp % swp) * sncw;
    const int vmi = warp & 3, vnc = CT >> 1, vct0 = (warp >> 2) * vnc; /* Vnew: 4 row tiles x CT */
    float sacc[8][4];
    __syncthreads(); /* X_s holds the start state */
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (s_on && j < sncw)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float *p = X_s + (16 * srt + g + 8 * (i >> 1)) * LDV + 8 * (sct0 + j) + 2 * t + (i & 1);
                sacc[j][i] = *p;
                *p = bits_f32(tf32_round(sacc[j][i])); /* this lane's own elements */
            }
    issue(jb.c0, 0);
    cp_async_commit();
    for (int ci = jb.c0; ci < jb.c1; ci++) {
        const int b = recur_wait_chunk(ci, jb.c0, jb.c1, nbuf, issue);
        __syncthreads(); /* everyone's copies, and X_s from the previous chunk */
        const float *Wb = buf0 + b * bufsz, *kgb = Wb + KC_CH * LDK, *Ub = kgb + KC_CH * LDG, *egb = Ub + KC_CH * LDV;
        const int n = min(KC_CH, nt - KC_CH * ci), row0 = irow0 + KC_CH * ci;
        /* W X for this warp's Vnew tiles */
        float vacc[4][4];
#pragma unroll
        for (int j = 0; j < 4; j++) vacc[j][0] = vacc[j][1] = vacc[j][2] = vacc[j][3] = 0.0f;
#pragma unroll 8
        for (int k0 = 0; k0 < K; k0 += 8) {
            const float *Wr = Wb + (16 * vmi + g) * LDK + k0 + t;
            const uint32_t af[4] = {tf32_round(Wr[0]), tf32_round(Wr[8 * LDK]), tf32_round(Wr[4]), tf32_round(Wr[8 * LDK + 4])};
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (j < vnc) {
                    const float *Xr = X_s + (k0 + t) * LDV + 8 * (vct0 + j) + g;
                    const uint32_t bf[2] = {f32_bits(Xr[0]), f32_bits(Xr[4 * LDV])};
                    mma_tf32_16x8x8(vacc[j], af, bf);
                }
        }
        /* Vnew = U - W X: to Vn_s (tf32) and, for the output stage, over U in the workspace */
        float *vng = w.v + ((size_t)h * T + row0) * V + jb.vcol;
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (j < vnc)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = 16 * vmi + g + 8 * hf, c = 8 * (vct0 + j) + 2 * t;
                    const float2 u = *(const float2 *)(Ub + r * LDV + c);
                    const float2 vn = make_float2(u.x - vacc[j][2 * hf], u.y - vacc[j][2 * hf + 1]);
                    *(float2 *)(Vn_s + r * LDV + c) = make_float2(bits_f32(tf32_round(vn.x)), bits_f32(tf32_round(vn.y)));
                    if (jb.out && r < n) *(float2 *)(vng + (size_t)r * V + c) = vn;
                }
        if (jb.out && s_on) { /* the state at the chunk's start, for the output stage */
            float *scg = w.sc + ((size_t)(gc0 + ci) * H + h) * K * V + jb.vcol;
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < sncw)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int r = 16 * srt + g + 8 * hf, c = 8 * (sct0 + j) + 2 * t;
                        *(float2 *)(scg + (size_t)r * V + c) = make_float2(sacc[j][2 * hf], sacc[j][2 * hf + 1]);
                    }
        }
        __syncthreads(); /* Vn_s complete; X_s no longer read */
        if (s_on) {
            const float e0 = egb[16 * srt + g], e1 = egb[16 * srt + g + 8];
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < sncw) sacc[j][0] *= e0, sacc[j][1] *= e0, sacc[j][2] *= e1, sacc[j][3] *= e1;
#pragma unroll
            for (int k0 = 0; k0 < KC_CH; k0 += 8) {
                const float *kr = kgb + (k0 + t) * LDG + 16 * srt + g;
                const uint32_t af[4] = {tf32_round(kr[0]), tf32_round(kr[8]), tf32_round(kr[4 * LDG]), tf32_round(kr[4 * LDG + 8])};
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (j < sncw) {
                        const float *Vr = Vn_s + (k0 + t) * LDV + 8 * (sct0 + j) + g;
                        const uint32_t bf[2] = {f32_bits(Vr[0]), f32_bits(Vr[4 * LDV])};
                        mma_tf32_16x8x8(sacc[j], af, bf);
                    }
            }
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (j < sncw)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int r = 16 * srt + g + 8 * hf, c = 8 * (sct0 + j) + 2 * t;
                        *(float2 *)(X_s + r * LDV + c) =
                            make_float2(bits_f32(tf32_round(sacc[j][2 * hf])), bits_f32(tf32_round(sacc[j][2 * hf + 1])));
                    }
        }
        __syncthreads(); /* before the next chunk reuses the buffer, Vn_s and X_s */
    }
    cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (s_on && j < sncw)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int r = 16 * srt + g + 8 * hf, c = 8 * (sct0 + j) + 2 * t;
                *(float2 *)(X_s + r * LDV + c) = make_float2(sacc[j][2 * hf], sacc[j][2 * hf + 1]);
            }
    __syncthreads(); /* the final state in X_s for the stores after the walk */
}

/* MMA: the mma.sync walk (tf32, BV = 64) as its own instantiation, so that the
 * wmma walk keeps its registers (<= 128: two blocks per SM at one buffer) */
template <int MODE, bool MMA, bool KSPLIT = false>
__global__ void __launch_bounds__(KC_THREADS) kc_chunk_recur_kernel(kc_kda_chunk_args a, ChunkWs w, int BV, int nbuf,
                                                                     int phase, int write_state)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    RecurJob jb;
    if (!recur_job(a, w, phase, BV, write_state, &jb)) return;
    const int item = blockIdx.x, h = blockIdx.y;
    const int gc0 = w.item_chunk0[item], irow0 = a.item_row0[item], nt = a.item_ntok[item];
    const int H = a.H, K = a.K, V = a.V, LDK = K + 4, LDG = K + 8, LDV = recur_ldv(BV), XW = K + V;
    const size_t T = a.T;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    KC_DYNAMIC_SMEM(sm);
    float *S_s = sm, *Vn_s = S_s + K * LDV, *buf0 = Vn_s + KC_CH * LDV;
    const int bufsz = KC_CH * LDK + KC_CH * LDG + KC_CH * LDV + K;
    const bool has_u = jb.vcol >= 0;
    /* BV, K / 4 and BV / 4 are powers of two: shifts instead of divisions in the per-chunk loops */
    const int bsh = log2i(BV), ksh = log2i(K / 4), vsh = log2i(BV / 4);

    auto issue = [&](int ci, int b) {
        float *Wb = buf0 + b * bufsz, *kgb = Wb + KC_CH * LDK, *Ub = kgb + KC_CH * LDG, *egb = Ub + KC_CH * LDV;
        const int n = min(KC_CH, nt - KC_CH * ci), row0 = irow0 + KC_CH * ci;
        const float *Wg = w.g + ((size_t)h * T + row0) * K, *kgg = w.k + ((size_t)h * T + row0) * K;
        const float *Ug = w.v + ((size_t)h * T + row0) * V + (has_u ? jb.vcol : 0);
        const int k4 = K / 4, v4 = BV / 4;
        for (int e = tid; e < KC_CH * k4; e += KC_THREADS) {
            const int r = e >> ksh, q = e & (k4 - 1);
            const bool ok = r < n;
            cp_async16(Wb + r * LDK + 4 * q, Wg + (size_t)(ok ? r : 0) * K + 4 * q, ok);
            cp_async16(kgb + r * LDG + 4 * q, kgg + (size_t)(ok ? r : 0) * K + 4 * q, ok);
        }
        for (int e = tid; e < KC_CH * v4; e += KC_THREADS) { /* identity columns: U = 0 */
            const int r = e >> vsh, q = e & (v4 - 1);
            const bool ok = has_u && r < n;
            cp_async16(Ub + r * LDV + 4 * q, Ug + (size_t)(ok ? r : 0) * V + 4 * q, ok);
        }
        for (int e = tid; e < k4; e += KC_THREADS) cp_async16(egb + 4 * e, w.egl + ((size_t)(gc0 + ci) * H + h) * K + 4 * e, true);
    };

    float *Sg = a.state + (size_t)a.item_slot[item] * a.slot_stride + (size_t)h * K * V + (has_u ? jb.vcol : 0);
    bf16 *Sb = (bf16 *)(a.state + (size_t)a.item_slot[item] * a.slot_stride) + (size_t)h * K * V +
                     (has_u ? jb.vcol : 0); /* state_bf16 (the split, which needs fp32, is refused with it) */
    const float *Xs = w.sstart + ((size_t)jb.seg * H + h) * K * V + (has_u ? jb.vcol : 0);
    for (int e = tid; e < K * BV; e += KC_THREADS) {
        const int d = e >> bsh, c = e & (BV - 1);
        float x = 0.0f;
        if (jb.start == RJ_SLOT) x = a.state_bf16 ? bf2f(Sb[(size_t)d * V + c]) : Sg[(size_t)d * V + c];
        else if (jb.start == RJ_SSTART) x = Xs[(size_t)d * V + c];
        else if (jb.start == RJ_IDENT) x = d == jb.mcol + c ? 1.0f : 0.0f;
        S_s[d * LDV + c] = x;
    }
    /* MMA (the launcher's choice at tf32 and BV = 64): the walk on mma.sync; narrower
     * blocks go through the wmma tiles below. H200
     * (bench, same call): recur ms at BV = 64 8 x 2048 0.59 vs 0.86, 4 x 8192 1.12 vs
     * 1.65, 8 x 128 0.071 vs 0.085; at BV = 32 the wmma walk is faster (8 x 128 0.067
     * vs 0.092), at 16 the two are even except 8 x 128 (0.079 vs 0.130). Both pass
     * every test case at every BV (63 cases with the mma walk at all BV, 18b9e7a). */
    if constexpr (MMA) {
        recur_chunks_mma(a, w, jb, BV, nbuf, S_s, Vn_s, buf0, bufsz, issue);
    } else {
        issue(jb.c0, 0);
        cp_async_commit();
        const int nvt = BV / 16;
        for (int ci = jb.c0; ci < jb.c1; ci++) {
            const int b = recur_wait_chunk(ci, jb.c0, jb.c1, nbuf, issue);
            __syncthreads(); /* everyone's copies, and X from the previous chunk */
            const float *Wb = buf0 + b * bufsz, *kgb = Wb + KC_CH * LDK, *Ub = kgb + KC_CH * LDG, *egb = Ub + KC_CH * LDV;
            const int n = min(KC_CH, nt - KC_CH * ci), row0 = irow0 + KC_CH * ci;
            if (jb.out) { /* the state at the chunk's start, for the output stage */
                float *scg = w.sc + ((size_t)(gc0 + ci) * H + h) * K * V + jb.vcol;
                for (int e = tid; e < K * BV; e += KC_THREADS) scg[(size_t)(e >> bsh) * V + (e & (BV - 1))] = S_s[(e >> bsh) * LDV + (e & (BV - 1))];
            }
            /* Vnew = U - W X */
            if (KSPLIT && 4 * nvt < KC_THREADS / 32) {
                /* BV = 16: four tiles for eight warps. Warps w and w + 4 take the two halves
                 * of K; w + 4's part reaches w through its tile of Vn_s: half the serial
                 * chain of the product (1 x 2048 runs its 32 chunks one after the other on
                 * one block per SM, so the chain is the time) */
                static_assert(KC_THREADS / 32 == 8, "two warps per Vnew tile");
                const int mi = warp & 3, kh = warp >> 2, K2 = K / 2;
                Acc<MODE> acc;
                if (kh == 0) acc.load(Ub + 16 * mi * LDV, LDV);
                else acc.zero();
                acc.template mma<true, true>(Wb + 16 * mi * LDK + kh * K2, LDK, S_s + (size_t)kh * K2 * LDV, LDV, K2, true);
                if (kh == 1) acc.store(Vn_s + 16 * mi * LDV, LDV);
                __syncthreads();
                if (kh == 0) {
                    acc.add(Vn_s + 16 * mi * LDV, LDV);
                    acc.store(Vn_s + 16 * mi * LDV, LDV);
                }
            } else {
                for (int t = warp; t < 4 * nvt; t += KC_THREADS / 32) {
                    const int mi = t / nvt, ni = t % nvt;
                    Acc<MODE> acc;
                    acc.load(Ub + 16 * mi * LDV + 16 * ni, LDV);
                    acc.template mma<true, true>(Wb + 16 * mi * LDK, LDK, S_s + 16 * ni, LDV, K, true);
                    acc.store(Vn_s + 16 * mi * LDV + 16 * ni, LDV);
                }
            }
            __syncthreads(); /* Vnew complete; X no longer read */
            if (jb.out) { /* in place of U (already in shared memory) */
                float *vng = w.v + ((size_t)h * T + row0) * V + jb.vcol;
                for (int e = tid; e < n * BV; e += KC_THREADS) vng[(size_t)(e >> bsh) * V + (e & (BV - 1))] = Vn_s[(e >> bsh) * LDV + (e & (BV - 1))];
            }
            /* X = diag(exp(Gam_last)) X + kg^T Vnew; each warp scales its own tiles */
            for (int t = warp; t < (K / 16) * nvt; t += KC_THREADS / 32) {
                const int mi = t / nvt, ni = t % nvt;
                float *St = S_s + 16 * mi * LDV + 16 * ni;
                for (int e = lane; e < 256; e += 32) St[(e >> 4) * LDV + (e & 15)] *= egb[16 * mi + (e >> 4)];
                __syncwarp();
                Acc<MODE> acc;
                acc.load(St, LDV);
                acc.template mma<false, true>(kgb + 16 * mi, LDG, Vn_s + 16 * ni, LDV, KC_CH, false);
                acc.store(St, LDV);
            }
            __syncthreads(); /* before the next chunk reuses the buffer, Vnew and X */
        }
        cp_async_wait<0>();
    }
    if (jb.end == RJ_END_SLOT && a.state_bf16)
        for (int e = tid; e < K * BV; e += KC_THREADS)
            ((bf16 *)Sb)[(size_t)(e >> bsh) * V + (e & (BV - 1))] = f2bf(S_s[(e >> bsh) * LDV + (e & (BV - 1))]);
    else if (jb.end == RJ_END_SLOT)
        for (int e = tid; e < K * BV; e += KC_THREADS) Sg[(size_t)(e >> bsh) * V + (e & (BV - 1))] = S_s[(e >> bsh) * LDV + (e & (BV - 1))];
    else if (jb.end == RJ_END_SEGX) {
        float *xg = w.segx + ((size_t)jb.seg * H + h) * K * XW + jb.xcol;
        for (int e = tid; e < K * BV; e += KC_THREADS) xg[(size_t)(e >> bsh) * XW + (e & (BV - 1))] = S_s[(e >> bsh) * LDV + (e & (BV - 1))];
    }
}

/* ---- combine (sequence split): block per (item, head, value block) ----
 * Walks the item's segments: start(s) = E(s-1) to sstart, then
 * E(s) = M_s E(s-1) + B_s; the last E is the new state. Shared memory
 * (floats): M [K][K+4], E and E' [K][BV+4]. */
static __host__ __device__ int combine_smem_floats(int K, int BV) { return K * (K + 4) + 2 * K * (BV + 4); }

template <int MODE>
__global__ void __launch_bounds__(KC_THREADS) kc_chunk_combine_kernel(kc_kda_chunk_args a, ChunkWs w, int BV,
                                                                       int write_state)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int item = blockIdx.x, h = blockIdx.y, vcol = blockIdx.z * BV;
    const int nseg = w.item_nchunks[item] ? w.item_nseg[item] : 0;
    if (nseg < 2) return;
    const int H = a.H, K = a.K, V = a.V, XW = K + V, LDM = K + 4, LDV = BV + 4;
    const int tid = threadIdx.x, warp = tid >> 5;
    KC_DYNAMIC_SMEM(sm);
    float *M_s = sm, *E_s = M_s + K * LDM, *E2_s = E_s + K * LDV;
    const int seg0 = w.item_seg0[item];
    const float *x0 = w.segx + ((size_t)seg0 * H + h) * K * XW + K + vcol;
    for (int e = tid; e < K * BV; e += KC_THREADS) E_s[(e / BV) * LDV + e % BV] = x0[(size_t)(e / BV) * XW + e % BV];
    const int nvt = BV / 16;
    for (int s = 1; s < nseg; s++) {
        const float *xs = w.segx + ((size_t)(seg0 + s) * H + h) * K * XW;
        for (int e = tid; e < K * (K / 4); e += KC_THREADS) {
            const int r = e / (K / 4), q = e % (K / 4);
            cp_async16(M_s + r * LDM + 4 * q, xs + (size_t)r * XW + 4 * q, true);
        }
        for (int e = tid; e < K * (BV / 4); e += KC_THREADS) { /* B_s into E', the accumulator's start */
            const int r = e / (BV / 4), q = e % (BV / 4);
            cp_async16(E2_s + r * LDV + 4 * q, xs + (size_t)r * XW + K + vcol + 4 * q, true);
        }
        cp_async_commit();
        __syncthreads(); /* E complete (previous step) */
        float *st = w.sstart + ((size_t)(seg0 + s) * H + h) * K * V + vcol;
        for (int e = tid; e < K * BV; e += KC_THREADS) st[(size_t)(e / BV) * V + e % BV] = E_s[(e / BV) * LDV + e % BV];
        cp_async_wait<0>();
        __syncthreads();
        for (int t = warp; t < (K / 16) * nvt; t += KC_THREADS / 32) {
            const int mi = t / nvt, ni = t % nvt;
            Acc<MODE> acc;
            acc.load(E2_s + 16 * mi * LDV + 16 * ni, LDV);
            acc.template mma<true, true>(M_s + 16 * mi * LDM, LDM, E_s + 16 * ni, LDV, K, false);
            acc.store(E2_s + 16 * mi * LDV + 16 * ni, LDV);
        }
        __syncthreads();
        float *tmp = E_s;
        E_s = E2_s, E2_s = tmp;
    }
    if (write_state) {
        float *Sg = a.state + (size_t)a.item_slot[item] * a.slot_stride + (size_t)h * K * V + vcol;
        for (int e = tid; e < K * BV; e += KC_THREADS) Sg[(size_t)(e / BV) * V + e % BV] = E_s[(e / BV) * LDV + e % BV];
    }
}

/* ---- out: block per (chunk, head, row block), all V columns ----
 * rsplit (1, 2 or 4) blocks share a chunk, each with 64 / rsplit of its rows:
 * few chunks (short prompts) spread over more SMs, each block's chain of
 * products shorter; many chunks keep one block per chunk, since every block
 * loads the chunk's whole S_c. Three phases through one shared region, so
 * that three blocks fit an SM (the stage is latency-bound: one block's loads
 * overlap the others' products): qg [64][K+4] (the block's rows) and the
 * first K/2 rows of S_c [K/2][V+8], then the other K/2 rows in their place,
 * for O = qg S_c; then Aqk [64][68] (the block's rows) and Vnew [64][V+8]
 * (rows up to the block's last: Aqk is lower triangular), then O, for
 * O += Aqk Vnew. Warp w owns output tiles w, w + 8, ... (<= 4), accumulated
 * in registers across the phases. */
static __host__ __device__ int out_smem_floats(int K, int V)
{
    const int a = KC_CH * (K + 4) + K / 2 * (V + 8), b = KC_CH * KC_LDA + KC_CH * (V + 8);
    return a > b ? a : b;
}

/* ---- tail: the new conv tail, the last taps - 1 raw rows of q | k | v (after
 * prep read the old one). Unit u of the call's n_items * ceil(Cc / 256) units:
 * item u / ceil(Cc / 256), 256 columns from (u % ceil(Cc / 256)) * 256, one a
 * thread. It runs in extra blocks of the output stage's launch (nothing there
 * reads the tail, and prep, which read the old one, is complete), so a call
 * has one launch fewer; short prompts are a chain of latency-bound launches. */
static __host__ __device__ int tail_col_blocks(const kc_kda_chunk_args &a)
{
    return (2 * a.H * a.K + a.H * a.V + KC_THREADS - 1) / KC_THREADS;
}
/* Row m reads old row m + ntok (> m) before that row is rewritten. */
static __device__ void chunk_tail(const kc_kda_chunk_args &a, const ChunkWs &w, int u)
{
    const int H = a.H, Cc = 2 * H * a.K + H * a.V, P = a.taps - 1, cb = tail_col_blocks(a);
    const int item = u / cb, col = (u % cb) * KC_THREADS + (int)threadIdx.x;
    if (item >= a.n_items || w.item_nchunks[item] == 0 || col >= Cc) return;
    const int nt = a.item_ntok[item], row0 = a.item_row0[item];
    float *tail = a.state + (size_t)a.item_slot[item] * a.slot_stride + kc_tail_off(H, a.K, a.V, a.state_bf16);
    for (int m = 0; m < P; m++) {
        const int pos = nt - P + m;
        tail[(size_t)m * Cc + col] = pos >= 0 ? a.proj[(size_t)(row0 + pos) * a.ldp + col] : tail[(size_t)(m + nt) * Cc + col];
    }
}

/* grid (max_chunks + tail_x, H, rsplit): blocks x < max_chunks compute the output
 * of chunk x; the others (tail_x > 0) take the tail's units, one a block, numbered
 * over (x - max_chunks, y, z) */
template <int MODE>
__global__ void __launch_bounds__(KC_THREADS) kc_chunk_out_kernel(kc_kda_chunk_args a, ChunkWs w, int rsplit)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    if ((int)blockIdx.x >= w.max_chunks) {
        chunk_tail(a, w, (((int)blockIdx.x - w.max_chunks) * (int)gridDim.y + (int)blockIdx.y) * rsplit + (int)blockIdx.z);
        return;
    }
    ChunkPos cp;
    if (!chunk_pos(a, w, blockIdx.x, &cp)) return;
    const int h = blockIdx.y, n = cp.n, row0 = cp.row0;
    /* this block's rows rb0 .. rb1 - 1 of the chunk (rsplit blocks share a chunk) */
    const int rb0 = blockIdx.z * (KC_CH / rsplit), rb1 = rb0 + KC_CH / rsplit, rt0 = rb0 / 16;
    if (rb0 >= n) return;
    /* ld = 8 mod 32 for the row-major B operands (S_c, Vnew): no bank conflicts */
    const int H = a.H, K = a.K, V = a.V, HK = H * K, HV = H * V, LDK = K + 4, LDV = V + 8, KH = K / 2;
    const size_t T = a.T;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    KC_DYNAMIC_SMEM(sm);
    float *qg_s = sm, *sc_s = qg_s + KC_CH * LDK; /* phases 1, 2 */
    float *aq_s = sm, *vn_s = aq_s + KC_CH * KC_LDA; /* phase 3 */
    const int k4 = K / 4, v4 = V / 4, ksh = log2i(k4), vsh = log2i(v4); /* powers of two */
    const float *sc = w.sc + ((size_t)blockIdx.x * H + h) * K * V;
    auto load_sc = [&](int half) {
        for (int e = tid; e < KH * v4; e += KC_THREADS) {
            const int r = e >> vsh, q = e & (v4 - 1);
            cp_async16(sc_s + r * LDV + 4 * q, sc + (size_t)(half * KH + r) * V + 4 * q, true);
        }
    };
    {
        const float *qg = w.q + ((size_t)h * T + row0) * K;
        for (int e = rb0 * k4 + tid; e < rb1 * k4; e += KC_THREADS) {
            const int r = e >> ksh, q = e & (k4 - 1);
            cp_async16(qg_s + r * LDK + 4 * q, qg + (size_t)(r < n ? r : 0) * K + 4 * q, r < n);
        }
        load_sc(0);
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads();
    const int nvt = V / 16, ntile = (rb1 - rb0) / 16 * nvt; /* V <= 128: <= 32 tiles, <= 4 per warp */
    Acc<MODE> acc[4];
    for (int half = 0; half < 2; half++) {
        if (half) {
            __syncthreads(); /* the first half of S_c read */
            load_sc(1);
            cp_async_commit();
            cp_async_wait<0>();
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int t = warp + 8 * i;
            if (t < ntile) {
                const int mi = rt0 + t / nvt, ni = t % nvt;
                if (!half) acc[i].zero();
                acc[i].template mma<true, true>(qg_s + 16 * mi * LDK + half * KH, LDK, sc_s + 16 * ni, LDV, KH, false);
            }
        }
    }
    __syncthreads(); /* qg and S_c read: phase 3 takes their place */
    {
        const float *vn = w.v + ((size_t)h * T + row0) * V, *aq = w.aqk + ((size_t)h * T + row0) * KC_CH;
        for (int e = tid; e < rb1 * v4; e += KC_THREADS) { /* Aqk's rows here reach column rb1 - 1 */
            const int r = e >> vsh, q = e & (v4 - 1);
            cp_async16(vn_s + r * LDV + 4 * q, vn + (size_t)(r < n ? r : 0) * V + 4 * q, r < n);
        }
        for (int e = rb0 * 16 + tid; e < rb1 * 16; e += KC_THREADS) {
            const int r = e >> 4, q = e & 15;
            cp_async16(aq_s + r * KC_LDA + 4 * q, aq + (size_t)(r < n ? r : 0) * KC_CH + 4 * q, r < n);
        }
        cp_async_commit();
        cp_async_wait<0>();
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = warp + 8 * i;
        if (t < ntile) {
            const int mi = rt0 + t / nvt, ni = t % nvt;
            if (rsplit == 1) /* the constant depth unrolls (many chunks: this path's instruction count matters) */
                acc[i].template mma<true, true>(aq_s + 16 * mi * KC_LDA, KC_LDA, vn_s + 16 * ni, LDV, KC_CH, false);
            else
                acc[i].template mma<true, true>(aq_s + 16 * mi * KC_LDA, KC_LDA, vn_s + 16 * ni, LDV, rb1, false);
        }
    }
    __syncthreads(); /* every product has read Vnew: O may take its place */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int t = warp + 8 * i;
        if (t < ntile) acc[i].store(vn_s + 16 * (rt0 + t / nvt) * LDV + 16 * (t % nvt), LDV);
    }
    __syncthreads();
    /* y = RMSNorm(o; onorm, eps) * sigmoid(G + g_bias), one warp per row */
    for (int r = rb0 + warp; r < min(rb1, n); r += KC_THREADS / 32) {
        const float *o = vn_s + r * LDV;
        float ss = 0.0f;
        for (int j = lane; j < V; j += 32) ss += o[j] * o[j];
        ss = warp_sum(ss);
        const float rn = 1.0f / sqrtf(ss / V + a.eps);
        const size_t row = (size_t)row0 + r;
        const float *G = a.lowrank + row * (HK + HV) + HK + h * V;
        for (int j = lane; j < V; j += 32) {
            const float gt = G[j] + (a.g_bias ? a.g_bias[h * V + j] : 0.0f);
            ((bf16 *)a.y)[row * a.ldy + h * V + j] = f2bf(o[j] * rn * a.onorm[j] * sigmoidf_(gt));
        }
    }
}

/* ---- launcher ---- */
static int sm_count(void)
{
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
            (void)cudaGetLastError();
            n = 132;
        }
    }
    return n;
}

/* Raise a kernel's dynamic shared memory limit once to what the call needs. */
template <typename Kern> static int smem_allow(Kern k, size_t bytes, size_t *allowed)
{
    if (bytes <= 48 * 1024 || bytes <= *allowed) return 0;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fprintf(stderr, "%s:%d: kda chunk: %zu bytes of shared memory refused: %s\n", __FILE__, __LINE__, bytes,
                cudaGetErrorString(e));
        return -7;
    }
    *allowed = bytes;
    return 0;
}

#define KC_CHUNK_LAUNCH(name, ...)                                                                  \
    do {                                                                                            \
        cudaError_t e_ = kc_launch(__VA_ARGS__);                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            (void)cudaGetLastError();                                                               \
            fprintf(stderr, "%s:%d: kda chunk %s launch failed: %s\n", __FILE__, __LINE__, name,    \
                    cudaGetErrorString(e_));                                                        \
            return -7;                                                                              \
        }                                                                                           \
    } while (0)

template <int MODE>
static int run_chunk_stages(const kc_kda_chunk_args *a, const ChunkWs &w, int bv, int nbuf, cudaStream_t s)
{
    static size_t allow_intra = 0, allow_intra16 = 0, allow_p1 = 0, allow_fin = 0, allow_recur = 0, allow_recur_mma = 0, allow_recur_ks = 0,
                  allow_out = 0, allow_comb = 0;
    const int H = a->H, K = a->K, V = a->V, stop = a->debug_stop_after, split = w.seq_split > 1;
    const int maxc = w.max_chunks, ws = stop == 0 ? 1 : 0;
    const size_t sm_intra = (size_t)intra_smem_floats(K) * 4, sm_recur = (size_t)recur_smem_floats(K, bv, nbuf) * 4;
    const size_t sm_out = (size_t)out_smem_floats(K, V) * 4, sm_comb = (size_t)combine_smem_floats(K, bv) * 4;
    const bool bk16 = K < 32; /* the intra stage's K slice: 16 or 32 channels */
    const bool mma = MODE == KC_KDA_GEMM_TF32 && bv == 64;
    /* BV = 16's split product (recur_ksplit, resolved by kc_kda_chunk: 2 = on) as its own
     * instantiation, so that the plain walk keeps its registers (with both in one kernel,
     * 8 x 128 at one buffer and two blocks per SM ran its recurrence in 0.101 ms against 0.066) */
    const bool ksplit = !mma && bv == 16 && a->recur_ksplit == 2;
    void (*recur_k)(kc_kda_chunk_args, ChunkWs, int, int, int, int) =
        mma ? kc_chunk_recur_kernel<KC_KDA_GEMM_TF32, true>
        : ksplit ? kc_chunk_recur_kernel<MODE, false, true> : kc_chunk_recur_kernel<MODE, false>;
    /* the intra stage in two launches: where the workspace has the parts and the chunks are few */
    const bool isplit = a->intra_split == 2 || (a->intra_split == 0 && K >= 64 && (long)maxc * H <= KC_ISPLIT_AUTO);
    if (isplit && (K < 64 || maxc > w.ipart_chunks)) return -1;
    if (smem_allow(kc_chunk_intra_kernel<MODE, 32, INTRA_FUSED>, sm_intra, &allow_intra) ||
        smem_allow(kc_chunk_intra_kernel<MODE, 16, INTRA_FUSED>, sm_intra, &allow_intra16) ||
        smem_allow(kc_chunk_intra_kernel<MODE, 32, INTRA_PASS1>, sm_intra, &allow_p1) ||
        smem_allow(kc_chunk_intra_kernel<MODE, 32, INTRA_FINISH>, sm_intra, &allow_fin) ||
        smem_allow(kc_chunk_recur_kernel<MODE, false>, sm_recur, &allow_recur) ||
        (ksplit && smem_allow(kc_chunk_recur_kernel<MODE, false, true>, sm_recur, &allow_recur_ks)) ||
        (mma && smem_allow(kc_chunk_recur_kernel<KC_KDA_GEMM_TF32, true>, sm_recur, &allow_recur_mma)) ||
        smem_allow(kc_chunk_out_kernel<MODE>, sm_out, &allow_out) ||
        (split && smem_allow(kc_chunk_combine_kernel<MODE>, sm_comb, &allow_comb)))
        return -7;
    if (!a->plan_ready) KC_CHUNK_LAUNCH("plan", kc_chunk_plan_kernel, dim3(1), dim3(1024), 0, s, *a, w);
    KC_CHUNK_LAUNCH("prep", kc_chunk_prep_kernel, dim3(maxc, H, 3), dim3(KC_PREP_THREADS), (size_t)KC_CH * K * 4, s, *a, w);
    if (stop == 1) return 0;
    if (isplit) { /* K >= 64: 32-channel slices */
        KC_CHUNK_LAUNCH("intra pass 1", kc_chunk_intra_kernel<MODE, 32, INTRA_PASS1>, dim3(maxc, H, K / 32), dim3(KC_THREADS),
                        sm_intra, s, *a, w);
        KC_CHUNK_LAUNCH("intra finish", kc_chunk_intra_kernel<MODE, 32, INTRA_FINISH>, dim3(maxc, H, (K + V) / 32),
                        dim3(KC_THREADS), sm_intra, s, *a, w);
    } else if (bk16)
        KC_CHUNK_LAUNCH("intra", kc_chunk_intra_kernel<MODE, 16, INTRA_FUSED>, dim3(maxc, H), dim3(KC_THREADS), sm_intra, s, *a, w);
    else
        KC_CHUNK_LAUNCH("intra", kc_chunk_intra_kernel<MODE, 32, INTRA_FUSED>, dim3(maxc, H), dim3(KC_THREADS), sm_intra, s, *a, w);
    if (stop == 2) return 0;
    if (!split) {
        KC_CHUNK_LAUNCH("recur", recur_k, dim3(a->n_items, H, V / bv), dim3(KC_THREADS), sm_recur,
                        s, *a, w, bv, nbuf, 0, ws);
    } else { /* segments' transitions (and segment 0, and unsplit items), the scan, the rest */
        KC_CHUNK_LAUNCH("recur split", recur_k, dim3(a->n_items, H, (K + V) / bv * w.seq_split),
                        dim3(KC_THREADS), sm_recur, s, *a, w, bv, nbuf, 1, ws);
        KC_CHUNK_LAUNCH("combine", kc_chunk_combine_kernel<MODE>, dim3(a->n_items, H, V / bv), dim3(KC_THREADS), sm_comb,
                        s, *a, w, bv, ws);
        KC_CHUNK_LAUNCH("recur rerun", recur_k, dim3(a->n_items, H, V / bv * (w.seq_split - 1)),
                        dim3(KC_THREADS), sm_recur, s, *a, w, bv, nbuf, 2, ws);
    }
    if (stop == 3) return 0;
    /* out's row split: the most blocks per chunk (4, 2, 1) that keep the grid within ~12 per SM.
     * H200, H = 16 (bench variants, 9b9fb39): out+tail ms 8 x 128 (24 chunks in the table)
     * 0.075 / 0.065 / 0.064 at 1 / 2 / 4, 1 x 1024 0.079 / 0.070 / 0.065, 16 x 128 (40)
     * 0.109 / 0.106 / 0.119 */
    int rsplit = a->out_split;
    const long out_cap = 12L * sm_count();
    if (!rsplit) rsplit = (long)maxc * H * 4 <= out_cap ? 4 : (long)maxc * H * 2 <= out_cap ? 2 : 1;
    /* the tail's blocks after the chunks' (none when stopping after the output stage) */
    const int per_x = H * rsplit, tail_x = stop == 0 && a->taps > 1 ? (a->n_items * tail_col_blocks(*a) + per_x - 1) / per_x : 0;
    KC_CHUNK_LAUNCH("out", kc_chunk_out_kernel<MODE>, dim3(maxc + tail_x, H, rsplit), dim3(KC_THREADS), sm_out, s, *a, w,
                    rsplit);
    return 0;
}

extern "C" int kc_kda_chunk(const kc_kda_chunk_args *a, cudaStream_t s)
{
    if (!kc_kda_chunk_supported(a->H, a->K, a->V, a->taps)) return -5;
    if (a->n_items < 0 || a->T < 0) return -1;
    if (a->n_items == 0) return 0;
    const int H = a->H, K = a->K, V = a->V, C = 2 * H * K + H * V;
    if (!a->proj || !a->lowrank || !a->item_row0 || !a->item_ntok || !a->item_slot || !a->state || !a->convw ||
        !a->A_log || !a->dt_bias || !a->onorm || !a->y || !a->work)
        return -1;
    if (a->ldp < C || a->off_beta < 0 || a->off_beta > a->ldp - H || a->ldy < H * V) return -1;
    if (a->slot_stride < kc_tail_off(H, K, V, a->state_bf16) + (size_t)(a->taps - 1) * C) return -1;
    if (a->state_bf16 && a->seq_split > 1) return -5; /* the split's transitions keep fp32 state */
    if (a->gemm < KC_KDA_GEMM_TF32 || a->gemm > KC_KDA_GEMM_SIMT || a->debug_stop_after < 0 || a->debug_stop_after > 4)
        return -1;
    if (a->seq_split < 0 || a->seq_split > KC_SEG_MAX || a->recur_buffers < 0 || a->recur_buffers > 2 ||
        a->recur_ksplit < 0 || a->recur_ksplit > 2)
        return -1;
    if (a->out_split != 0 && a->out_split != 1 && a->out_split != 2 && a->out_split != 4) return -1;
    if (a->intra_split < 0 || a->intra_split > 2) return -1;
    const int split = a->seq_split > 1 ? a->seq_split : 0;
    kc_kda_chunk_layout L;
    kc_kda_chunk_layout_of(a->T, a->n_items, H, K, V, split, &L);
    if (a->work_bytes < L.bytes || ((uintptr_t)a->work & 255)) return -1;
    /* value block: the widest that still gives every SM a block; for a large
     * call (>= 8192 rows) 64 once the blocks cover 7/8 of the SMs: each block
     * of a head loads the same W and kg per chunk, and those loads, not the
     * products, bound the mma.sync recurrence there. H200, H = 16 (bench
     * variants at the mma.sync recurrence): 8 x 2048 (256 blocks of 64 or 512
     * of 32) 2.67 vs 2.95 ms per layer call, 4 x 8192 (128 vs 256) 5.16 vs
     * 5.73; 1 x 8192 (32 blocks of 64) 2.23 vs 1.70 at 16, so no. */
    int bv = a->bv;
    if (bv == 0) {
        const long heads = (long)a->n_items * H, sms = sm_count();
        const bool big = a->T >= 8192 && V >= 64 && heads * (V / 64) >= sms - sms / 8;
        bv = big || (V >= 64 && heads * (V / 64) >= 2L * sms) ? 64 : V >= 32 && heads * (V / 32) >= sms ? 32 : 16;
    }
    if (bv != 16 && bv != 32 && bv != 64) return -1;
    if (!a->bv && split)
        while (K % bv) bv /= 2; /* the transition's identity columns come in blocks of bv */
    if (bv > V || (split && K % bv)) return -1;
    /* recurrence buffers: 2 (chunk c + 1's loads in flight, one block per SM)
     * while the blocks fit one wave, or where one buffer would not let two
     * blocks share an SM; else 1, two blocks per SM. H200, H = 16 (bench):
     * 8 x 2048 (512 blocks of BV = 32) 0.96 -> 0.79 ms, 4 x 8192 (256)
     * 1.83 -> 1.56 with 1; 1 x 2048 and 1 x 8192 (128 blocks of BV = 16)
     * 1.5x faster with 2. */
    const long recur_blocks = (long)a->n_items * H * (split ? (K + V) / bv * split : V / bv);
    const bool two_per_sm = 2 * ((size_t)recur_smem_floats(K, bv, 1) * 4 + 1024) <= KC_SMEM_SM;
    const int nbuf = a->recur_buffers ? a->recur_buffers : recur_blocks > sm_count() && two_per_sm ? 1 : 2;
    char *base = (char *)a->work;
    ChunkWs w;
    w.nchunks = (int *)(base + L.plan_nchunks);
    w.status = (int *)(base + L.status);
    w.item_chunk0 = (int *)(base + L.item_chunk0);
    w.item_nchunks = (int *)(base + L.item_nchunks);
    w.item_nseg = (int *)(base + L.item_nseg);
    w.item_seg0 = (int *)(base + L.item_seg0);
    w.chunk_item = (int *)(base + L.chunk_item);
    w.chunk_local = (int *)(base + L.chunk_local);
    w.q = (float *)(base + L.q);
    w.k = (float *)(base + L.k);
    w.v = (float *)(base + L.v);
    w.g = (float *)(base + L.g);
    w.beta = (float *)(base + L.beta);
    w.aqk = (float *)(base + L.aqk);
    w.egl = (float *)(base + L.egl);
    w.sc = (float *)(base + L.sc);
    w.segx = (float *)(base + L.segx);
    w.sstart = (float *)(base + L.sstart);
    w.ipart = (float *)(base + L.ipart);
    w.ipart_chunks = L.ipart_chunks;
    w.max_chunks = L.max_chunks;
    w.max_segs = L.max_segs;
    w.seq_split = split;
    kc_kda_chunk_args ar = *a; /* the kernels read the resolved recur_ksplit: 2 = on */
    ar.recur_ksplit = a->recur_ksplit ? a->recur_ksplit : recur_blocks <= sm_count() ? 2 : 1;
    switch (a->gemm) {
    case KC_KDA_GEMM_3XTF32: return run_chunk_stages<KC_KDA_GEMM_3XTF32>(&ar, w, bv, nbuf, s);
    case KC_KDA_GEMM_SIMT: return run_chunk_stages<KC_KDA_GEMM_SIMT>(&ar, w, bv, nbuf, s);
    default: return run_chunk_stages<KC_KDA_GEMM_TF32>(&ar, w, bv, nbuf, s);
    }
}
