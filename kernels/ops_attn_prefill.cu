/*
 * ops_attn_prefill.cu - causal attention of prompt chunks over the paged KV
 * cache (FlashAttention-2 style: online softmax in fp32, bf16 tensor cores
 * through mma.sync m16n8k16), the prompt-side counterpart of the per-row
 * flash-decoding kernel in ops_gqa.cu.
 *
 * Work decomposition. A block takes one row tile of one item for one KV
 * head: TQ consecutive query tokens x the G = Hq / Hkv query heads of that
 * KV head = 16 * NW query rows (row r = token r / G, head r % G), so every
 * K/V tile loaded serves all the heads that share it. Each warp owns 16
 * rows. The block walks the item's keys in tiles of PF_BN through the block
 * table (gathered rows, cp.async, two stages), skips the tiles past the
 * tile's last position, masks element-wise only where a tile crosses a
 * row's position. Grid: (Hkv, row tiles, context splits). Row tiles are
 * flattened over the items (the bound ceil(T / TQ) + n_items is launched;
 * blocks past the real count exit), each item's tiles heaviest first so the
 * long causal rows start early.
 *
 * Context split (flash-decoding): when the row tiles alone cannot fill the
 * GPU (a short chunk after a long cached prefix), the keys are cut into
 * nsplit ranges of split_keys; each block writes its unnormalised partial
 * (o, m, l) to the workspace and a merge kernel combines them, one block per
 * (KV head, token).
 * The last split always runs to the row's end, so an underestimated max_ctx
 * is slower, never wrong.
 *
 * Numerics: q rounded to bf16 at load (K/V are bf16 in the cache), scores
 * and the online softmax in fp32 (base-2 exponent, scale folded in), P
 * rounded to bf16 for the P.V product, fp32 accumulation, one bf16 rounding
 * of the output. Fragment layouts: PTX ISA, "Matrix Fragments for
 * mma.m16n8k16" (A row-major 16x16, B 16x8, C/D 16x8 fp32; lane = 4 * group
 * + thread-in-group).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "prefill_ops.h"

#define PF_BN 64              /* keys per K/V tile */
#define PF_NSPLIT_CAP 32      /* most context splits of one call */
#define PF_SPLIT_ROWS 4096    /* rows x splits the split path may use (bounds the workspace) */
#define PF_MIN_SPLIT_KEYS 256 /* fewest keys worth a split of their own */

typedef struct {
    const int32_t *row0, *ntok, *pos0, *slot;
    int n;
} pf_items;

typedef struct {
    int row0, ntok, pos0, slot, tile;
} pf_tile;

/* Row tile u of the flattened list: items in order, item i has
 * ceil(ntok / TQ) tiles (none when slot < 0), the last tile first. Called by
 * every full warp of the block (shuffles); every warp gets the same answer.
 * false: u is past the last tile. */
static __device__ bool pf_find_tile(const pf_items &it, int TQ, int u, pf_tile &out)
{
    const int lane = threadIdx.x & 31;
    int base = 0;
    for (int c = 0; c < it.n; c += 32) {
        const int i = c + lane;
        int nt = 0;
        if (i < it.n && it.slot[i] >= 0 && it.row0[i] >= 0) nt = (max(it.ntok[i], 0) + TQ - 1) / TQ;
        int incl = nt;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        const int total = __shfl_sync(0xffffffffu, incl, 31);
        if (u < base + total) {
            const unsigned hit = __ballot_sync(0xffffffffu, u < base + incl);
            const int src = __ffs(hit) - 1;
            const int first = base + __shfl_sync(0xffffffffu, incl - nt, src);
            const int ntiles = __shfl_sync(0xffffffffu, nt, src);
            const int ii = c + src;
            out.row0 = it.row0[ii];
            out.ntok = it.ntok[ii];
            out.pos0 = it.pos0[ii];
            out.slot = it.slot[ii];
            out.tile = ntiles - 1 - (u - first);
            return true;
        }
        base += total;
    }
    return false;
}

/* ---- PTX wrappers (KC_EMU: the CPU emulator's, tests/kernels/emu) ---- */
#if defined(KC_EMU)
static __device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool full)
{
    kc_emu_cp_async16(smem, gmem, full);
}
static __device__ __forceinline__ void cp_async_wait1() { kc_emu_cp_async_wait(1); }
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p) { kc_emu_ldmatrix_x4(r, p, false); }
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *p) { kc_emu_ldmatrix_x4(r, p, true); }
static __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    const uint32_t b[2] = {b0, b1};
    kc_emu_mma_m16n8k16_bf16(d, a, b);
}
#else
static __device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* 16 bytes, or (full false) 16 zero bytes: src-size 0 reads nothing */
static __device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool full)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(full ? 16 : 0));
}
static __device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

/* four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m */
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
/* d += a (16x16 bf16, row) * b (16x8 bf16, col), fp32 accumulate */
static __device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif
/* lo in the low half: the lower column index of a fragment pair */
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

static constexpr size_t pf_smem_bytes(int hd)
{
    /* K and V tiles, two stages, rows padded by 8 elements (16 bytes) so the
     * 8 row addresses of an ldmatrix hit distinct banks; then the key row
     * offsets of two tiles */
    return (size_t)2 * 2 * PF_BN * (hd + 8) * 2 + (size_t)2 * PF_BN * 8;
}

/* One K/V tile (keys k0 .. k0 + PF_BN - 1 in shared memory, rows LDS apart)
 * for this warp's 16 rows: S = q K^T, causal mask where the tile crosses a
 * row's position, online softmax update of (m, l, o), o += P V. */
template <int HD>
static __device__ __forceinline__ void attn_tile(const bf16 *Kt, const bf16 *Vt, const uint32_t (&qf)[HD / 16][4],
                                                 float (&o)[HD / 8][4], float (&m)[2], float (&l)[2],
                                                 const int (&qpos)[2], const int (&qlo)[2], int k0, int wq_min,
                                                 int wlo_max, float sl, int lane, int tig)
{
    constexpr int LDS = HD + 8, KCH = HD / 16, NT = PF_BN / 8, DT = HD / 8;
    float s[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KCH; kk++)
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            /* matrices: keys +0..7 | +0..7 | +8..15 | +8..15 of the pair, dims +0 | +8 | +0 | +8 */
            uint32_t b[4];
            ldsm_x4(b, Kt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_16816(s[2 * np], qf[kk], b[0], b[1]);
            mma_16816(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
    /* the tile crosses some row's position, or (sliding window) starts
     * before some row's first key */
    if (k0 + PF_BN - 1 > wq_min || k0 < wlo_max) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kp = k0 + nt * 8 + 2 * tig + (e & 1);
                if (kp > qpos[e >> 1] || kp < qlo[e >> 1]) s[nt][e] = -INFINITY;
            }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[i], mx * sl);
        /* mn == -inf only while the row has seen no key: corr and p are then 0, not NaN */
        const float mref = mn == -INFINITY ? 0.0f : mn;
        const float corr = exp2f(m[i] - mref);
        m[i] = mn;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = exp2f(fmaf(s[nt][2 * i + e], sl, -mref));
                s[nt][2 * i + e] = p;
                rs += p;
            }
        l[i] = fmaf(l[i], corr, rs); /* this thread's columns; the quad is summed at the end */
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][2 * i] *= corr;
            o[dt][2 * i + 1] *= corr;
        }
    }
#pragma unroll
    for (int kc = 0; kc < PF_BN / 16; kc++) {
        /* the S accumulators of key tiles 2kc, 2kc+1 are the A fragment of P */
        const uint32_t pa[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                                pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                                pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            /* transposed: keys +0..7 | +8..15 | +0..7 | +8..15, dims +0 | +0 | +8 | +8 */
            uint32_t b[4];
            ldsm_x4_trans(b, Vt + (kc * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + dp * 16 + (lane >> 4) * 8);
            mma_16816(o[2 * dp], pa, b[0], b[1]);
            mma_16816(o[2 * dp + 1], pa, b[2], b[3]);
        }
    }
}

/* grid (Hkv, row-tile bound, nsplit), NW warps. nsplit == 1: normalised,
 * gated bf16 rows to out; else partials to opart [nsplit, T, Hq, hd] and
 * ml [nsplit, T, Hq, 2] = (max in log2 units, sum). */
template <int HD, int G, int NW, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB)
    attn_prefill_kernel(kc_gqa_args a, pf_items items, bf16 *out, int ldo, float *opart, float *ml, int nsplit,
                        int split_keys)
{
    constexpr int NTH = NW * 32, M = 16 * NW, TQ = M / G, LDS = HD + 8;
    constexpr int KCH = HD / 16; /* 16-dim chunks of q.k */
    constexpr int DT = HD / 8;   /* 8-dim column tiles of O */
    constexpr int CPR = HD / 8;  /* 16-byte pieces per K/V row */
    static_assert(M % G == 0 && 16 % G == 0, "a warp's 16 rows hold whole tokens");
    KC_DYNAMIC_SMEM(pf_smem);
    bf16 *sK = (bf16 *)pf_smem; /* [2][PF_BN][LDS] */
    bf16 *sV = sK + 2 * PF_BN * LDS;
    long long *soff = (long long *)(sV + 2 * PF_BN * LDS); /* [2][PF_BN] element offset of each key's K row, -1: none */

    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    const int kvh = blockIdx.x, sp = blockIdx.z;
    pf_tile it;
    if (!pf_find_tile(items, TQ, blockIdx.y, it)) return;
    const int tok0 = it.tile * TQ;
    const int ntq = min(min(TQ, it.ntok - tok0), a.T - (it.row0 + tok0)); /* valid tokens of the tile */
    if (ntq <= 0) return;
    const int kcap = a.max_blocks * a.blk; /* positions the block table can address */
    const int tile_kend = min(it.pos0 + tok0 + ntq, kcap);
    /* sliding window: no row of the tile reads keys below its first row's
     * first key; every split the combine reads for a row (pf_combine_value
     * from the split holding the row's first key) still runs here */
    /* rounded down to a tile: the tiles then end on the split's end (split_keys is a
     * multiple of PF_BN), and the keys of the last tile past ke are past every row's
     * position, so the causal mask removes their zero-filled scores (an unrounded start
     * let a split's last tile run into the next split's keys as zeros: H200, 63b2e44) */
    const int tile_klo = a.window > 0 ? max(0, it.pos0 + tok0 - a.window + 1) / PF_BN * PF_BN : 0;
    const int ks = max(sp * split_keys, tile_klo);
    const int ke = sp == nsplit - 1 ? tile_kend : min(tile_kend, sp * split_keys + split_keys);
    if (ks >= ke) return; /* the combine reads only splits that hold some of a row's keys */

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, grp = lane >> 2, tig = lane & 3;
    /* this thread's two rows: grp and grp + 8 of the warp */
    int trow[2], head[2], qpos[2], qlo[2]; /* qlo: the row's first key (INT_MIN: no window) */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + grp + 8 * i, tq = r / G;
        const bool valid = tq < ntq;
        trow[i] = valid ? it.row0 + tok0 + tq : -1;
        head[i] = kvh * G + r % G;
        qpos[i] = valid ? it.pos0 + tok0 + tq : -1;
        qlo[i] = a.window > 0 ? qpos[i] - a.window + 1 : INT_MIN;
    }
    const int wtq0 = warp * 16 / G, wtq1 = min((warp * 16 + 15) / G, ntq - 1);
    const bool warp_live = wtq0 < ntq;
    const int wq_min = it.pos0 + tok0 + wtq0, wq_max = it.pos0 + tok0 + wtq1;
    /* sliding window: the first keys of the warp's first and last rows */
    const int wlo_min = a.window > 0 ? wq_min - a.window + 1 : INT_MIN;
    const int wlo_max = a.window > 0 ? wq_max - a.window + 1 : INT_MIN;

    /* q as A fragments, bf16, for the whole walk */
    uint32_t qf[KCH][4];
#pragma unroll
    for (int kk = 0; kk < KCH; kk++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float2 v = make_float2(0.0f, 0.0f);
                if (trow[i] >= 0)
                    v = *(const float2 *)(a.q + ((size_t)trow[i] * a.Hq + head[i]) * HD + kk * 16 + half * 8 + 2 * tig);
                qf[kk][i + 2 * half] = pack_bf16x2(v.x, v.y);
            }

    const bf16 *kvb = (const bf16 *)a.kv;
    const size_t voff = (size_t)a.Hkv * a.blk * HD; /* V rows follow the K rows of the layer's block */
    const int32_t *btab = a.block_table + (size_t)it.slot * a.max_blocks;
    static_assert(PF_BN <= NTH, "one key offset per thread");
    /* cache block of key k0 + threadIdx.x (-1: none); read a tile ahead, its
     * row offset stored after the compute */
    auto key_block = [&](int k0) -> int {
        const int p = k0 + (int)threadIdx.x;
        return threadIdx.x < PF_BN && p < ke ? btab[p / a.blk] : -1;
    };
    auto set_offset = [&](int k0, int b, int buf) { /* element offset of the key's K row, -1: none */
        const int p = k0 + (int)threadIdx.x;
        if (threadIdx.x < PF_BN)
            soff[buf * PF_BN + threadIdx.x] = b < 0 ? -1
                                                    : (long long)b * (long long)a.block_stride + (long long)a.layer_off +
                                                          ((long long)kvh * a.blk + p % a.blk) * HD;
    };
    /* thread tid copies 16-byte piece tid % CPR of keys tid / CPR + i NTH / CPR: the
     * shared-memory offsets are constants of the unrolled loop (ncu, 1 x 8192: the
     * address arithmetic of the runtime loop was ~20% of the kernel's instructions) */
    static_assert(NTH % CPR == 0 && (PF_BN * CPR) % NTH == 0, "whole pieces per thread");
    const int ipart = (int)threadIdx.x % CPR, ikey = (int)threadIdx.x / CPR;
    auto issue_tile = [&](int buf) {
        bf16 *dk0 = sK + (buf * PF_BN + ikey) * LDS + ipart * 8, *dv0 = sV + (buf * PF_BN + ikey) * LDS + ipart * 8;
        const long long *so = soff + buf * PF_BN + ikey;
#pragma unroll
        for (int i = 0; i < PF_BN * CPR / NTH; i++) {
            const long long off = so[i * (NTH / CPR)];
            /* past the range: zeros (src-size 0), so p = 0 never meets a NaN */
            const bf16 *src = off >= 0 ? kvb + off + ipart * 8 : kvb;
            cp_async16_zfill(dk0 + i * (NTH / CPR) * LDS, src, off >= 0);
            cp_async16_zfill(dv0 + i * (NTH / CPR) * LDS, off >= 0 ? src + voff : kvb, off >= 0);
        }
        cp_async_commit();
    };

    const float sl = 1.4426950408889634f / sqrtf((float)HD); /* log2(e) / sqrt(hd) */
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

    const int ntiles = (ke - ks + PF_BN - 1) / PF_BN;
    set_offset(ks, key_block(ks), 0);
    __syncthreads();
    issue_tile(0);
    set_offset(ks + PF_BN, key_block(ks + PF_BN), 1);
    for (int j = 0; j < ntiles; j++) {
        const int st = j & 1, k0 = ks + j * PF_BN;
        __syncthreads(); /* offsets of tile j+1 written; stage st^1 no longer read (tile j-1 done) */
        if (j + 1 < ntiles) issue_tile(st ^ 1);
        else cp_async_commit(); /* empty group: the wait below always leaves exactly one */
        const int b2 = key_block(ks + (j + 2) * PF_BN); /* tile j+2, into soff[st] below */
        cp_async_wait1();
        __syncthreads(); /* tile j visible to all */
        /* else every row of this warp ends before the tile, or (window) starts after it */
        if (warp_live && k0 <= wq_max && k0 + PF_BN - 1 >= wlo_min)
            attn_tile<HD>(sK + st * PF_BN * LDS, sV + st * PF_BN * LDS, qf, o, m, l, qpos, qlo, k0, wq_min, wlo_max,
                          sl, lane, tig);
        set_offset(ks + (j + 2) * PF_BN, b2, st);
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    if (!warp_live) return;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (trow[i] < 0) continue;
        if (nsplit == 1) {
            const float inv = 1.0f / l[i];
            bf16 *orow = out + (size_t)trow[i] * ldo + head[i] * HD;
            /* the row's gate values loaded together before any store: one memory latency
             * per row, not one per column pair (ncu, 1 x 8192: the epilogue's dependent
             * loads were ~12% of the stall samples) */
            float gv[DT][2];
#pragma unroll
            for (int dt = 0; dt < DT; dt++) gv[dt][0] = gv[dt][1] = 1.0f;
            if (a.off_gate >= 0) {
                const float *grow = a.proj + (size_t)trow[i] * a.ldp + a.off_gate + head[i] * HD;
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    gv[dt][0] = __ldg(grow + dt * 8 + 2 * tig);
                    gv[dt][1] = __ldg(grow + dt * 8 + 2 * tig + 1);
                }
#pragma unroll
                for (int dt = 0; dt < DT; dt++) gv[dt][0] = sigmoidf_(gv[dt][0]), gv[dt][1] = sigmoidf_(gv[dt][1]);
            }
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                const int d = dt * 8 + 2 * tig;
                *(__nv_bfloat162 *)(orow + d) = __floats2bfloat162_rn(o[dt][2 * i] * inv * gv[dt][0], o[dt][2 * i + 1] * inv * gv[dt][1]);
            }
        } else {
            const size_t prow = ((size_t)sp * a.T + trow[i]) * a.Hq + head[i];
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(float2 *)(opart + prow * HD + dt * 8 + 2 * tig) = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
            if (tig == 0) *(float2 *)(ml + prow * 2) = make_float2(m[i], l[i]);
        }
    }
}

/* The merge of one output value: row it.row0 + tok0 + tq, query head h, dim d.
 * The splits that hold some of the row's keys (m in log2 units), gated, to bf16. */
static __device__ __forceinline__ void pf_combine_value(const kc_gqa_args &a, const pf_tile &it, int tok0, int tq, int h,
                                                        int d, const float *opart, const float *ml, int nsplit,
                                                        int split_keys, bf16 *out, int ldo)
{
    const int hd = a.hd, kcap = a.max_blocks * a.blk;
    const int trow = it.row0 + tok0 + tq;
    const int kend = min(it.pos0 + tok0 + tq + 1, kcap);
    const int ns = min(nsplit, (kend + split_keys - 1) / split_keys);
    /* sliding window: the splits from the one holding the row's first key */
    const int klo = a.window > 0 ? max(0, it.pos0 + tok0 + tq - a.window + 1) : 0;
    const int s0 = min(klo / split_keys, ns - 1);
    float M = -INFINITY;
    for (int s = s0; s < ns; s++) M = fmaxf(M, ml[(((size_t)s * a.T + trow) * a.Hq + h) * 2]);
    float L = 0.0f, o = 0.0f;
    for (int s = s0; s < ns; s++) {
        const size_t prow = ((size_t)s * a.T + trow) * a.Hq + h;
        const float w = exp2f(ml[prow * 2] - M);
        L = fmaf(w, ml[prow * 2 + 1], L);
        o = fmaf(w, opart[prow * hd + d], o);
    }
    o /= L;
    if (a.off_gate >= 0) o *= sigmoidf_(a.proj[(size_t)trow * a.ldp + a.off_gate + h * hd + d]);
    out[(size_t)trow * ldo + h * hd + d] = f2bf(o);
}

/* The merge: grid (Hkv, row-tile bound, TQ), block z merges token z of the
 * tile (G x hd values, 4 a thread at the 1.7B shape). It replaced a merge of
 * one block per (KV head, row tile), 64 values a thread, whose latency-bound
 * loop took 131 us a layer in 8 x 17 after 1,023 against 13.4 for this one,
 * with the same bits (H100, 2026-12-07, results/h100-2026-12-07-combine-44654e2.txt). */
__global__ void __launch_bounds__(128)
    attn_prefill_combine_tok_kernel(kc_gqa_args a, pf_items items, int TQ, const float *opart, const float *ml,
                                    int nsplit, int split_keys, bf16 *out, int ldo)
{
    KC_PDL_WAIT();
    KC_PDL_TRIGGER();
    pf_tile it;
    if (!pf_find_tile(items, TQ, blockIdx.y, it)) return;
    const int G = a.Hq / a.Hkv, hd = a.hd, kvh = blockIdx.x, tq = blockIdx.z;
    const int tok0 = it.tile * TQ;
    const int ntq = min(min(TQ, it.ntok - tok0), a.T - (it.row0 + tok0));
    if (tq >= ntq) return;
    for (int idx = threadIdx.x; idx < G * hd; idx += blockDim.x)
        pf_combine_value(a, it, tok0, tq, kvh * G + idx / hd, idx % hd, opart, ml, nsplit, split_keys, out, ldo);
}

/* ---- host side ---- */
typedef void (*pf_kernel_fn)(kc_gqa_args, pf_items, bf16 *, int, float *, float *, int, int);

/* Variants (kc_attn_prefill_tuning.variant, benchmarks): 1 (default) 4 warps, 3 blocks
 * per SM (168 registers; group 1 at hd 128 would spill there and gets 2
 * blocks, 200 registers); 2: 4 warps, 2 blocks per SM (200 registers);
 * 3: 8 warps (128-row tiles: half the K/V loads per row), 1 block per SM.
 * 2 and 3 exist for the 1.7B shape only (hd 128, group 4): each hd-128
 * instantiation is ~250 KB of SASS + line info in every binary. */
template <int HD> static pf_kernel_fn pf_pick_g(int G)
{
    switch (G) {
    case 1:
        if constexpr (HD == 128) return attn_prefill_kernel<HD, 1, 4, 2>;
        else return attn_prefill_kernel<HD, 1, 4, 3>;
    case 2: return attn_prefill_kernel<HD, 2, 4, 3>;
    case 4: return attn_prefill_kernel<HD, 4, 4, 3>;
    case 8: return attn_prefill_kernel<HD, 8, 4, 3>;
    }
    return NULL;
}
static pf_kernel_fn pf_pick(int hd, int G, int variant)
{
    switch (hd) {
    case 16: return pf_pick_g<16>(G);
    case 32: return pf_pick_g<32>(G);
    case 64: return pf_pick_g<64>(G);
    case 128:
        if (G == 4 && variant == 2) return attn_prefill_kernel<128, 4, 4, 2>;
        if (G == 4 && variant == 3) return attn_prefill_kernel<128, 4, 8, 1>;
        return pf_pick_g<128>(G);
    }
    return NULL;
}

/* Dynamic shared memory opt-in and occupancy, once per kernel. The kernels
 * are launched from one thread (the backend's inference thread; the tests). */
static int pf_prepare(pf_kernel_fn k, int threads, size_t smem)
{
    static struct {
        pf_kernel_fn k;
        int occ;
    } seen[40];
    static int n_seen = 0;
    for (int i = 0; i < n_seen; i++)
        if (seen[i].k == k) return seen[i].occ;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        fprintf(stderr, "kc_attn_prefill: %zu bytes of shared memory refused: %s\n", smem,
                cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    int occ = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k, threads, smem) != cudaSuccess || occ < 1) {
        (void)cudaGetLastError();
        occ = 1;
    }
    if (n_seen < 40) seen[n_seen].k = k, seen[n_seen].occ = occ, n_seen++;
    return occ;
}

static int pf_sm_count(void)
{
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            sms < 1) {
            (void)cudaGetLastError();
            sms = 132;
        }
    }
    return sms;
}

static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

static int pf_check(const kc_gqa_args *a, int ldo, const void *out)
{
    const char *why = NULL;
    if (a->hd != 16 && a->hd != 32 && a->hd != 64 && a->hd != 128) why = "hd must be 16, 32, 64 or 128";
    else if (a->Hkv <= 0 || a->Hq % a->Hkv) why = "Hq must be a multiple of Hkv";
    else if (a->Hq / a->Hkv != 1 && a->Hq / a->Hkv != 2 && a->Hq / a->Hkv != 4 && a->Hq / a->Hkv != 8)
        why = "group Hq / Hkv must be 1, 2, 4 or 8";
    else if (a->blk <= 0 || a->max_blocks <= 0) why = "empty block table";
    else if (a->block_stride % 8 || a->layer_off % 8 || ((uintptr_t)a->kv & 15)) why = "KV cache rows not 16-byte aligned";
    else if (((uintptr_t)a->q & 7)) why = "q not 8-byte aligned";
    else if ((ldo & 1) || ldo < a->Hq * a->hd || ((uintptr_t)out & 3)) why = "ldo must be even and >= Hq * hd";
    if (!why) return 0;
    fprintf(stderr, "kc_attn_prefill: refused (Hq %d, Hkv %d, hd %d, ldo %d): %s\n", a->Hq, a->Hkv, a->hd, ldo, why);
    return -5;
}

int kc_attn_prefill_plan_for(const kc_gqa_args *a, int n_items, int max_ctx, size_t work_bytes,
                             const kc_attn_prefill_tuning *tune, kc_attn_prefill_plan *p)
{
    static const kc_attn_prefill_tuning defaults = {0, 0};
    if (!tune) tune = &defaults;
    memset(p, 0, sizeof *p);
    if (pf_check(a, a->Hq * a->hd, (const void *)0)) return -5;
    const int G = a->Hq / a->Hkv, hd = a->hd;
    p->variant = hd == 128 && G == 4 ? tune->variant : 1;
    if (p->variant < 1 || p->variant > 3) p->variant = 1;
    p->warps = p->variant == 3 ? 8 : 4;
    p->tile_tokens = 16 * p->warps / G;
    const long units = (long)ceil_div(a->T, p->tile_tokens) + n_items;
    if (units > 65535) {
        fprintf(stderr, "kc_attn_prefill: refused: %d rows, %d items exceed the grid\n", a->T, n_items);
        return -5;
    }
    p->grid_x = a->Hkv;
    p->grid_y = (int)units;
    const int kcap = a->max_blocks * a->blk;
    if (max_ctx <= 0 || max_ctx > kcap) max_ctx = kcap;
    const size_t per_split = (size_t)a->T * a->Hq * (hd + 2) * 4; /* opart + ml of one split */
    const size_t fit = per_split ? work_bytes / per_split : 0; /* splits the workspace holds */
    const int ws_splits = fit < 1024 ? (int)fit : 1024;
    const int forced = tune->split_keys;
    int ns;
    if (forced > 0) {
        ns = ceil_div(max_ctx, (forced + PF_BN - 1) / PF_BN * PF_BN);
    } else {
        pf_kernel_fn k = pf_pick(hd, G, p->variant);
        const int occ = pf_prepare(k, p->warps * 32, pf_smem_bytes(hd));
        if (occ < 0) return -7;
        const long resident = (long)occ * pf_sm_count();
        ns = (int)(resident / (units * a->Hkv));
        ns = ns < PF_NSPLIT_CAP ? ns : PF_NSPLIT_CAP;
        ns = ns < PF_SPLIT_ROWS / a->T ? ns : PF_SPLIT_ROWS / a->T;
        ns = ns < ceil_div(max_ctx, PF_MIN_SPLIT_KEYS) ? ns : ceil_div(max_ctx, PF_MIN_SPLIT_KEYS);
    }
    if (ns > ws_splits) ns = ws_splits;
    if (ns >= 2) {
        p->split_keys = ceil_div(ceil_div(max_ctx, ns), PF_BN) * PF_BN;
        p->nsplit = ceil_div(max_ctx, p->split_keys);
    }
    if (ns < 2 || p->nsplit < 2) {
        p->nsplit = 1;
        p->split_keys = INT_MAX / 2; /* the one split holds every key */
    }
    p->grid_z = p->nsplit;
    p->work_needed = p->nsplit > 1 ? per_split * p->nsplit : 0;
    return 0;
}

size_t kc_attn_prefill_workspace(int T, int n_items, int Hq, int hd, int max_ctx)
{
    (void)n_items;
    if (T <= 0 || Hq <= 0 || hd <= 0 || max_ctx <= 0) return 0;
    /* the plan keeps T * nsplit <= PF_SPLIT_ROWS and nsplit <= these caps, all
     * monotone in T and max_ctx: this bounds every smaller call as well */
    long ns = ceil_div(max_ctx, PF_MIN_SPLIT_KEYS);
    if (ns > PF_NSPLIT_CAP) ns = PF_NSPLIT_CAP;
    if (ns < 2) return 0;
    long rows = (long)T * ns;
    if (rows > PF_SPLIT_ROWS) rows = PF_SPLIT_ROWS;
    return (size_t)rows * Hq * (hd + 2) * 4;
}

int kc_attn_prefill(const kc_gqa_args *a, const int32_t *item_row0, const int32_t *item_ntok,
                    const int32_t *item_pos0, const int32_t *item_slot, int n_items, int max_ctx,
                    uint16_t *out, int ldo, void *work, size_t work_bytes, const kc_attn_prefill_tuning *tune,
                    cudaStream_t s)
{
    if (a->T <= 0 || n_items <= 0) return 0;
    if (pf_check(a, ldo, out)) return -5;
    if (!work || ((uintptr_t)work & 15)) work_bytes = 0;
    kc_attn_prefill_plan p;
    const int rc = kc_attn_prefill_plan_for(a, n_items, max_ctx, work_bytes, tune, &p);
    if (rc) return rc;
    const int G = a->Hq / a->Hkv;
    pf_kernel_fn k = pf_pick(a->hd, G, p.variant);
    const size_t smem = pf_smem_bytes(a->hd);
    if (pf_prepare(k, p.warps * 32, smem) < 0) return -7;
    const pf_items items = {item_row0, item_ntok, item_pos0, item_slot, n_items};
    float *opart = p.nsplit > 1 ? (float *)work : NULL;
    float *ml = p.nsplit > 1 ? opart + (size_t)p.nsplit * a->T * a->Hq * a->hd : NULL;
    KC_LAUNCH(k, dim3(p.grid_x, p.grid_y, p.grid_z), dim3(p.warps * 32), smem, s, *a, items, (bf16 *)out, ldo, opart,
              ml, p.nsplit, p.split_keys);
    if (p.nsplit > 1) {
        const int vals = G * a->hd; /* a power of two, >= 16 */
        KC_LAUNCH(attn_prefill_combine_tok_kernel, dim3(p.grid_x, p.grid_y, p.tile_tokens), dim3(vals < 128 ? (vals < 32 ? 32 : vals) : 128),
                  0, s, *a, items, p.tile_tokens, (const float *)opart, (const float *)ml, p.nsplit, p.split_keys,
                  (bf16 *)out, ldo);
    }
    return 0;
}
