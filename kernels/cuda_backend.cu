/*
 * cuda_backend.cu - the CUDA backend: one device pool, weights uploaded and
 * re-laid-out once, paged GQA KV cache, per-slot KDA state, and a forward
 * pass of cuBLAS GEMMs (or the skinny GEMV at small batch) plus the fused
 * kernels of ops_*.cu. Decode steps (every item one token) replay a CUDA
 * graph captured per batch-size bucket; anything else (prompt chunks) runs
 * the same kernels eagerly, in passes of at most TM rows.
 *
 * Pool layout (llm.c style: sizes computed first, one cudaMalloc, carved):
 *   weights | KDA state [max_seqs][n_kda][S (H,K,V) + tails] | activations |
 *   cuBLAS workspace | KV blocks [n_blocks][n_gqa][K|V][Hkv][BLK][hd] bf16.
 * Nothing is allocated on the token path. Invariants: slot s's KDA state is
 * only written by items with slot s; padding rows carry slot -1 and no
 * kernel touches state for them; a KV block belongs to at most one slot.
 */
#include <cublas_v2.h>
#include "cuda_gemm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

extern "C" {
#include "cpu_ops.h"
#include "model.h"
}

#define KV_BLK 16          /* tokens per KV block */
#define MAX_TOP 64
#define N_BUCKETS 16

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, errlen, "CUDA error %s at %s:%d (%s)", cudaGetErrorString(e_), __FILE__, \
                     __LINE__, #call);                                                             \
            return KDA_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)
#define KK(call)                                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            snprintf(err, errlen, "kernel launch failed at %s:%d (%s)", __FILE__, __LINE__, #call);\
            return KDA_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

typedef struct {
    uint16_t *w_mix;   /* KDA: [q|k|v|f0|g0|b rows, D]; GQA: [q|gate|k|v rows, D] bf16 */
    uint16_t *w_o;     /* [D, HV or Hq*hd] */
    uint16_t *w_gu;    /* [2F, D] gate rows then up rows */
    uint16_t *w_down;  /* [D, F] */
    float *attn_norm, *mlp_norm; /* [D] */
    int n_mix;         /* rows of w_mix */
    /* KDA */
    float *convw;      /* [2HK+HV, taps] */
    uint16_t *f1t, *g1t; /* [R, HK], [R, HV] */
    float *g_bias, *A_log, *dt_bias, *onorm;
    int kda_idx;
    /* GQA */
    float *q_norm, *k_norm;
    int gqa_idx;
} cu_layer;

/* Host-side mirror of the per-step row metadata, uploaded in one copy. */
typedef struct {
    int32_t *tok_ids, *tok_pos, *tok_slot;    /* [TM] */
    int32_t *item_row0, *item_ntok, *item_slot; /* [TM] */
    int32_t *out_rows;                        /* [TM] rows whose logits are computed */
    int32_t *lp_rows, *lp_targets;            /* [TM] */
} step_meta;

typedef struct {
    backend base;
    const model_config *c;
    int max_seqs, max_seq_len, TM;
    int D, F, vocab, L, n_kda, n_gqa;
    int H, K, Vh, R, taps, HK, HV;
    int kda_off_f0, kda_off_g0, kda_off_beta, kda_cols;
    int Hq, Hkv, hd, gqa_off_q, gqa_off_g, gqa_off_k, gqa_off_v, gqa_cols;
    int ldp;
    int gemv_max_t, use_graphs, pdl;
    float eps;
    char devname[256];
    cudaStream_t st;
    cublasHandle_t cublas;
    char *pool;
    size_t pool_size;
    /* weights */
    cu_layer *lw;
    uint16_t *embed, *lm_head;
    float *final_norm;
    size_t weight_bytes;
    /* state */
    float *state;
    size_t slot_floats, kda_layer_floats;
    /* KV */
    uint16_t *kv;
    int n_blocks, max_blocks;
    size_t block_elems, kv_layer_elems;
    int32_t *d_table, *h_table; /* [max_seqs, max_blocks] */
    int *nblk;                  /* [max_seqs] blocks held */
    int *free_blocks, n_free;
    /* activations */
    float *h, *proj, *q, *opart, *ml, *logits, *lse, *tlp, *lowrank;
    uint16_t *xn, *act, *ybuf;
    int rs_cap;                 /* rows x splits the attention scratch holds */
    int32_t *d_meta;            /* device copy of step_meta arrays, 9 x TM */
    int32_t *h_meta;            /* pinned */
    step_meta dm, hm;
    kc_sample_param *d_sp, *h_sp;
    int32_t *d_hist, *h_hist;
    size_t hist_cap;
    int *d_scratch;
    int32_t *d_tok, *h_tok, *d_top, *h_top;
    float *d_lp, *h_lp, *d_toplp, *h_toplp, *h_tlp;
    void *cublas_ws;
    size_t cublas_ws_size;
    kc_gemm_lt *glt; /* tuned cublasLt plans (NULL: plain kc_gemm) */
    /* graphs per bucket */
    cudaGraphExec_t graph[N_BUCKETS];
    int graph_T[N_BUCKETS];
    int graph_split[N_BUCKETS];
    /* pool accounting */
    size_t state_bytes, kv_bytes, act_bytes;
} cuda_backend;

int cuda_device_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* ---- pool carving ---- */
static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }

typedef struct {
    char *base;
    size_t off;
} carver;
static void *carve(carver *cv, size_t bytes)
{
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += align_up(bytes);
    return p;
}

/* ---- weight upload: convert on the host into a staging buffer, copy ---- */
static int upload_rows(uint16_t *dst, const tensor_view *t, int64_t r0, int64_t nrows, char *err, size_t errlen)
{
    const int64_t cols = t->cols;
    uint16_t *stage = (uint16_t *)malloc((size_t)nrows * cols * 2);
    float *row = (float *)malloc((size_t)cols * 4);
    if (!stage || !row) {
        free(stage), free(row);
        snprintf(err, errlen, "out of host memory uploading %s", t->name ? t->name : "?");
        return KDA_ENOMEM;
    }
    for (int64_t r = 0; r < nrows; r++) {
        if (t->dtype == DT_BF16) {
            memcpy(stage + r * cols, tv_row(t, r0 + r), (size_t)cols * 2);
        } else {
            tv_row_f32(t, r0 + r, row);
            for (int64_t i = 0; i < cols; i++) stage[r * cols + i] = f32_to_bf16(row[i]);
        }
    }
    cudaError_t e = cudaMemcpy(dst, stage, (size_t)nrows * cols * 2, cudaMemcpyHostToDevice);
    free(stage), free(row);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading %s: %s", t->name ? t->name : "?", cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

static int upload_matrix(uint16_t *dst, const tensor_view *t, char *err, size_t errlen)
{
    /* in slices so the host staging stays small */
    const int64_t slice = 4096;
    for (int64_t r = 0; r < t->rows; r += slice) {
        int64_t n = t->rows - r < slice ? t->rows - r : slice;
        int rc = upload_rows(dst + (size_t)r * t->cols, t, r, n, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* [rows, cols] view -> device [cols, rows] bf16 */
static int upload_transposed(uint16_t *dst, const tensor_view *t, char *err, size_t errlen)
{
    const int64_t R = t->rows, C = t->cols;
    uint16_t *stage = (uint16_t *)malloc((size_t)R * C * 2);
    float *row = (float *)malloc((size_t)C * 4);
    if (!stage || !row) {
        free(stage), free(row);
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    for (int64_t r = 0; r < R; r++) {
        tv_row_f32(t, r, row);
        for (int64_t c = 0; c < C; c++) stage[c * R + r] = f32_to_bf16(row[c]);
    }
    cudaError_t e = cudaMemcpy(dst, stage, (size_t)R * C * 2, cudaMemcpyHostToDevice);
    free(stage), free(row);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading %s: %s", t->name ? t->name : "?", cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

/* fp32 vector/matrix (rows*cols floats); absent tensor -> fill with `dflt` */
static int upload_f32(float *dst, const tensor_view *t, size_t n, float dflt, char *err, size_t errlen)
{
    float *v = (float *)malloc(n * 4);
    if (!v) {
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    if (t && t->data) {
        for (int64_t r = 0; r < t->rows; r++) tv_row_f32(t, r, v + (size_t)r * t->cols);
    } else {
        for (size_t i = 0; i < n; i++) v[i] = dflt;
    }
    cudaError_t e = cudaMemcpy(dst, v, n * 4, cudaMemcpyHostToDevice);
    free(v);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "upload: %s", cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

/* ---- the forward pass over T rows whose metadata is on the device ---- */
static int attn_split_for(const cuda_backend *b, int T)
{
    const int msl = b->max_seq_len;
    static int forced = -1; /* KDA_CUDA_ATTN_SPLIT=32..256: one split size for every pass (diagnosis) */
    if (forced < 0) {
        const char *v = getenv("KDA_CUDA_ATTN_SPLIT");
        forced = v ? atoi(v) : 0;
        if (forced != 32 && forced != 64 && forced != 128 && forced != 256) forced = 0;
    }
    if (forced && (long)T * ((msl + forced - 1) / forced) <= b->rs_cap) return forced;
    int split = 256;
    while (split > 32 && (long)T * b->Hkv * ((msl + split / 2 - 1) / (split / 2)) <= 1024) split /= 2;
    return split;
}

/* kc_gemm through the tuned cublasLt plan when there is one */
static int gemm(cuda_backend *b, float *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N,
                int K, float beta, cudaStream_t s)
{
    if (b->glt) {
        const int rc = kc_gemm_lt_run(b->glt, y, ldy, x, ldx, W, T, N, K, beta, s);
        if (rc <= 0) return rc;
    }
    return kc_gemm(b->cublas, y, ldy, x, ldx, W, T, N, K, beta, s);
}

static int forward(cuda_backend *b, int T, int n_items, int n_out, int split, char *err, size_t errlen)
{
    const int D = b->D, F = b->F;
    cudaStream_t s = b->st;
    const int gemv = T <= b->gemv_max_t;
    KK(kc_embed(b->h, b->embed, b->dm.tok_ids, T, D, s));
    for (int l = 0; l < b->L; l++) {
        const cu_layer *w = &b->lw[l];
        /* mixer input projections (one GEMM for all of them) */
        if (gemv) {
            KK(kc_gemv(b->proj, b->ldp, w->w_mix, w->n_mix, D, b->h, D, w->attn_norm, b->eps, T, KC_IN_NORM,
                       KC_OUT_STORE, s));
        } else {
            KK(kc_rmsnorm(b->xn, b->h, NULL, w->attn_norm, T, D, b->eps, s));
            KK(gemm(b, b->proj, b->ldp, b->xn, D, w->w_mix, T, w->n_mix, D, 0.0f, s));
        }
        int ycols;
        if (b->c->kind[l] == KDA_LAYER_KDA) {
            kc_kda_args a;
            memset(&a, 0, sizeof a);
            a.proj = b->proj;
            a.ldp = b->ldp;
            a.off_f0 = b->kda_off_f0;
            a.off_g0 = b->kda_off_g0;
            a.off_beta = b->kda_off_beta;
            a.item_row0 = b->dm.item_row0;
            a.item_ntok = b->dm.item_ntok;
            a.item_slot = b->dm.item_slot;
            a.n_items = n_items;
            a.state = b->state + (size_t)w->kda_idx * b->kda_layer_floats;
            a.slot_stride = b->slot_floats;
            a.convw = w->convw;
            a.f1t = w->f1t;
            a.g1t = w->g1t;
            a.g_bias = w->g_bias;
            a.A_log = w->A_log;
            a.dt_bias = w->dt_bias;
            a.onorm = w->onorm;
            a.eps = b->eps;
            a.H = b->H, a.K = b->K, a.V = b->Vh, a.R = b->R, a.taps = b->taps;
            a.y = b->ybuf;
            a.ldy = b->HV;
            a.lowrank = b->lowrank;
            a.lowrank_rows = T;
            KK(kc_kda_step(&a, s));
            ycols = b->HV;
        } else {
            kc_gqa_args a;
            memset(&a, 0, sizeof a);
            a.proj = b->proj;
            a.ldp = b->ldp;
            a.off_q = b->gqa_off_q, a.off_k = b->gqa_off_k, a.off_v = b->gqa_off_v, a.off_gate = b->gqa_off_g;
            a.tok_pos = b->dm.tok_pos;
            a.tok_slot = b->dm.tok_slot;
            a.T = T;
            a.q_norm = w->q_norm, a.k_norm = w->k_norm;
            a.eps = b->eps;
            a.Hq = b->Hq, a.Hkv = b->Hkv, a.hd = b->hd, a.rope_dim = b->c->rope_dim;
            a.theta = b->c->rope_theta;
            a.q = b->q;
            a.kv = b->kv;
            a.block_stride = b->block_elems;
            a.layer_off = (size_t)w->gqa_idx * b->kv_layer_elems;
            a.blk = KV_BLK;
            a.block_table = b->d_table;
            a.max_blocks = b->max_blocks;
            KK(kc_gqa_qkv(&a, s));
            const int nsplit = (b->max_seq_len + split - 1) / split;
            KK(kc_gqa_attn(&a, b->opart, b->ml, nsplit, split, b->ybuf, b->Hq * b->hd, s));
            ycols = b->Hq * b->hd;
        }
        /* output projection, residual added in the epilogue */
        if (gemv)
            KK(kc_gemv(b->h, D, w->w_o, D, ycols, b->ybuf, ycols, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        else
            KK(gemm(b, b->h, D, b->ybuf, ycols, w->w_o, T, D, ycols, 1.0f, s));
        /* MLP */
        if (gemv) {
            KK(kc_gemv(b->act, F, w->w_gu, F, D, b->h, D, w->mlp_norm, b->eps, T, KC_IN_NORM, KC_OUT_SWIGLU, s));
            KK(kc_gemv(b->h, D, w->w_down, D, F, b->act, F, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        } else {
            KK(kc_rmsnorm(b->xn, b->h, NULL, w->mlp_norm, T, D, b->eps, s));
            KK(gemm(b, b->proj, 2 * F, b->xn, D, w->w_gu, T, 2 * F, D, 0.0f, s));
            KK(kc_swiglu(b->act, b->proj, T, F, s));
            KK(gemm(b, b->h, D, b->act, F, w->w_down, T, D, F, 1.0f, s));
        }
    }
    if (n_out > 0) {
        KK(kc_rmsnorm(b->xn, b->h, b->dm.out_rows, b->final_norm, n_out, D, b->eps, s));
        if (n_out <= b->gemv_max_t)
            KK(kc_gemv(b->logits, b->vocab, b->lm_head, b->vocab, D, b->xn, D, NULL, 0.0f, n_out, KC_IN_BF16,
                       KC_OUT_STORE, s));
        else
            KK(gemm(b, b->logits, b->vocab, b->xn, D, b->lm_head, n_out, b->vocab, D, 0.0f, s));
    }
    return 0;
}

/* ---- KV block bookkeeping (host side; the table is mirrored on the device) ---- */
static void kv_release(cuda_backend *b, int slot)
{
    for (int i = 0; i < b->nblk[slot]; i++) b->free_blocks[b->n_free++] = b->h_table[(size_t)slot * b->max_blocks + i];
    b->nblk[slot] = 0;
}

/* Gives slot blocks until it holds want (caller checked n_free); the device
 * copy of the table is updated on the backend's stream, ahead of any step. */
static cudaError_t kv_grow(cuda_backend *b, int slot, int want)
{
    if (want <= b->nblk[slot]) return cudaSuccess;
    const int first = b->nblk[slot];
    while (b->nblk[slot] < want) b->h_table[(size_t)slot * b->max_blocks + b->nblk[slot]++] = b->free_blocks[--b->n_free];
    return cudaMemcpyAsync(b->d_table + (size_t)slot * b->max_blocks + first,
                           b->h_table + (size_t)slot * b->max_blocks + first, (size_t)(want - first) * 4,
                           cudaMemcpyHostToDevice, b->st);
}

static int cuda_seq_reserve(backend *bb, int slot, int n_tokens, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (!b->n_gqa) return 0;
    const int want = (n_tokens + KV_BLK - 1) / KV_BLK;
    const int need = want - b->nblk[slot];
    if (need > b->n_free) {
        snprintf(err, errlen, "KV cache full: %d tokens need %d more blocks of %d tokens, %d free", n_tokens, need,
                 KV_BLK, b->n_free);
        return KDA_ENOMEM;
    }
    if (kv_grow(b, slot, want) != cudaSuccess) {
        snprintf(err, errlen, "block table upload failed");
        return KDA_EDEVICE;
    }
    return 0;
}

static void cuda_seq_release(backend *bb, int slot)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (slot >= 0 && slot < b->max_seqs) kv_release(b, slot);
}

static int cuda_seq_reset(backend *bb, int slot, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (slot < 0 || slot >= b->max_seqs) {
        snprintf(err, errlen, "slot %d out of range", slot);
        return KDA_EINVAL;
    }
    kv_release(b, slot);
    CK(cudaMemsetAsync(b->state + (size_t)slot * b->slot_floats, 0, b->slot_floats * sizeof(float), b->st));
    CK(cudaStreamSynchronize(b->st));
    return 0;
}

/* Upload metadata (and the changed block-table rows) for a pass. */
static int upload_meta(cuda_backend *b, char *err, size_t errlen)
{
    CK(cudaMemcpyAsync(b->d_meta, b->h_meta, (size_t)9 * b->TM * sizeof(int32_t), cudaMemcpyHostToDevice, b->st));
    return 0;
}

static int run_pass(cuda_backend *b, int T, int n_items, int n_out, int decode, char *err, size_t errlen)
{
    int rc = upload_meta(b, err, errlen);
    if (rc) return rc;
    if (decode && b->use_graphs) {
        /* bucket: the smallest power of two >= T (rows beyond T are padding) */
        int bi = 0, Tb = 1;
        while (Tb < T) Tb <<= 1, bi++;
        if (Tb > b->TM) Tb = b->TM;
        if (!b->graph[bi]) {
            const int split = attn_split_for(b, Tb);
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
            rc = forward(b, Tb, Tb, Tb, split, err, errlen);
            cudaError_t e = cudaStreamEndCapture(b->st, &g);
            if (rc) return rc;
            if (e != cudaSuccess) {
                snprintf(err, errlen, "graph capture failed: %s", cudaGetErrorString(e));
                return KDA_EDEVICE;
            }
            CK(cudaGraphInstantiate(&b->graph[bi], g, 0));
            cudaGraphDestroy(g);
            b->graph_T[bi] = Tb;
        }
        CK(cudaGraphLaunch(b->graph[bi], b->st));
        return 0;
    }
    return forward(b, T, n_items, n_out, attn_split_for(b, T), err, errlen);
}

static int wants_all(const kda_batch_item *it) { return it->want_all_logits || (it->targets && it->target_logprobs); }

/* After a pass: copy the outputs of its rows back. row_item/row_tok map out rows to (item, token). */
static int emit_outputs(cuda_backend *b, const step_item *items, const int *row_item, const int *row_tok, int n_out,
                        char *err, size_t errlen)
{
    const int vocab = b->vocab;
    int need_lse = 0, n_lp = 0, n_sp = 0, hist_n = 0, any_logits = 0;
    for (int r = 0; r < n_out; r++) {
        const kda_batch_item *it = items[row_item[r]].it;
        const int last = row_tok[r] == it->n_tokens - 1;
        if (it->targets && it->target_logprobs) {
            b->hm.lp_rows[n_lp] = r;
            b->hm.lp_targets[n_lp] = it->targets[row_tok[r]];
            n_lp++;
            need_lse = 1;
        }
        if (it->logits && (it->want_all_logits || last)) any_logits = 1;
        if (last && it->sampling) {
            const kda_sampling *sp = it->sampling;
            kc_sample_param *p = &b->h_sp[n_sp++];
            memset(p, 0, sizeof *p);
            p->row = r;
            p->temperature = sp->temperature;
            p->top_k = sp->top_k;
            p->top_p = sp->top_p;
            p->min_p = sp->min_p;
            p->rep = sp->repetition_penalty;
            p->pres = sp->presence_penalty;
            p->freq = sp->frequency_penalty;
            p->seed = sp->seed;
            p->counter = (uint64_t)sp->n_gen;
            p->n_top = it->n_top;
            p->hist_off = hist_n;
            const int pen = (sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0.0f) ||
                            sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
            if (pen && (size_t)(hist_n + sp->n_prompt + sp->n_gen) <= b->hist_cap) {
                if (sp->n_prompt) memcpy(b->h_hist + hist_n, sp->prompt_tokens, (size_t)sp->n_prompt * 4);
                if (sp->n_gen) memcpy(b->h_hist + hist_n + sp->n_prompt, sp->gen_tokens, (size_t)sp->n_gen * 4);
                p->n_prompt = sp->n_prompt;
                p->n_gen = sp->n_gen;
                hist_n += sp->n_prompt + sp->n_gen;
            } else if (pen) {
                snprintf(err, errlen, "penalty history too long (%d tokens)", sp->n_prompt + sp->n_gen);
                return KDA_EINVAL;
            }
            need_lse = 1;
        }
    }
    cudaStream_t s = b->st;
    if (need_lse) KK(kc_row_lse(b->lse, b->logits, n_out, vocab, s));
    if (n_lp) {
        CK(cudaMemcpyAsync(b->dm.lp_rows, b->hm.lp_rows, (size_t)n_lp * 4, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(b->dm.lp_targets, b->hm.lp_targets, (size_t)n_lp * 4, cudaMemcpyHostToDevice, s));
        KK(kc_gather_logprob(b->tlp, b->logits, b->lse, b->dm.lp_rows, b->dm.lp_targets, n_lp, vocab, s));
        CK(cudaMemcpyAsync(b->h_tlp, b->tlp, (size_t)n_lp * 4, cudaMemcpyDeviceToHost, s));
    }
    if (n_sp) {
        CK(cudaMemcpyAsync(b->d_sp, b->h_sp, (size_t)n_sp * sizeof(kc_sample_param), cudaMemcpyHostToDevice, s));
        if (hist_n) CK(cudaMemcpyAsync(b->d_hist, b->h_hist, (size_t)hist_n * 4, cudaMemcpyHostToDevice, s));
        KK(kc_sample(b->d_sp, n_sp, b->logits, vocab, b->lse, b->d_hist, b->d_scratch, b->d_tok, b->d_lp, b->d_top,
                     b->d_toplp, MAX_TOP, s));
        CK(cudaMemcpyAsync(b->h_tok, b->d_tok, (size_t)n_sp * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(b->h_lp, b->d_lp, (size_t)n_sp * 4, cudaMemcpyDeviceToHost, s));
        int any_top = 0;
        for (int i = 0; i < n_sp; i++) any_top |= b->h_sp[i].n_top > 0;
        if (any_top) {
            CK(cudaMemcpyAsync(b->h_top, b->d_top, (size_t)n_sp * MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaMemcpyAsync(b->h_toplp, b->d_toplp, (size_t)n_sp * MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
        }
    }
    if (any_logits) {
        for (int r = 0; r < n_out; r++) {
            const kda_batch_item *it = items[row_item[r]].it;
            const int last = row_tok[r] == it->n_tokens - 1;
            if (!it->logits || !(it->want_all_logits || last)) continue;
            float *dst = it->logits + (it->want_all_logits ? (size_t)row_tok[r] * vocab : 0);
            CK(cudaMemcpyAsync(dst, b->logits + (size_t)r * vocab, (size_t)vocab * 4, cudaMemcpyDeviceToHost, s));
        }
    }
    CK(cudaStreamSynchronize(s));
    int ilp = 0, isp = 0;
    for (int r = 0; r < n_out; r++) {
        const kda_batch_item *it = items[row_item[r]].it;
        const int last = row_tok[r] == it->n_tokens - 1;
        if (it->targets && it->target_logprobs) it->target_logprobs[row_tok[r]] = b->h_tlp[ilp++];
        if (last && it->sampling) {
            if (it->sampled) *it->sampled = b->h_tok[isp];
            if (it->sampled_logprob) *it->sampled_logprob = b->h_lp[isp];
            if (it->n_top > 0 && it->top_ids && it->top_logprobs) {
                memcpy(it->top_ids, b->h_top + (size_t)isp * MAX_TOP, (size_t)it->n_top * 4);
                memcpy(it->top_logprobs, b->h_toplp + (size_t)isp * MAX_TOP, (size_t)it->n_top * 4);
            }
            isp++;
        }
    }
    return 0;
}

static int cuda_step(backend *bb, const step_item *items, int n, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    /* ---- validate and admit before touching any state ---- */
    int need_blocks = 0, decode = 1;
    for (int i = 0; i < n; i++) {
        const step_item *si = &items[i];
        if (si->slot < 0 || si->slot >= b->max_seqs || si->it->n_tokens <= 0) {
            snprintf(err, errlen, "item %d: bad slot %d or no tokens", i, si->slot);
            return KDA_EINVAL;
        }
        if (si->pos + si->it->n_tokens > b->max_seq_len) {
            snprintf(err, errlen, "item %d: %d + %d tokens exceeds the context capacity %d", i, si->pos,
                     si->it->n_tokens, b->max_seq_len);
            return KDA_ECTX;
        }
        if (si->it->n_top > MAX_TOP) {
            snprintf(err, errlen, "item %d: n_top %d > %d", i, si->it->n_top, MAX_TOP);
            return KDA_EINVAL;
        }
        const int want = (si->pos + si->it->n_tokens + KV_BLK - 1) / KV_BLK;
        if (b->n_gqa && want > b->nblk[si->slot]) need_blocks += want - b->nblk[si->slot];
        if (si->it->n_tokens != 1) decode = 0;
    }
    if (need_blocks > b->n_free) {
        snprintf(err, errlen,
                 "KV cache full: this step needs %d more blocks of %d tokens, %d free (the request waits or is refused; "
                 "no sequence was changed)",
                 need_blocks, KV_BLK, b->n_free);
        return KDA_ENOMEM;
    }
    for (int i = 0; i < n && b->n_gqa; i++) {
        const int want = (items[i].pos + items[i].it->n_tokens + KV_BLK - 1) / KV_BLK;
        if (kv_grow(b, items[i].slot, want) != cudaSuccess) {
            snprintf(err, errlen, "block table upload failed");
            return KDA_EDEVICE;
        }
    }

    int *row_item = (int *)malloc((size_t)b->TM * sizeof(int) * 2);
    if (!row_item) {
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    int *row_tok = row_item + b->TM;
    int rc = 0;
    if (decode && n <= b->TM) {
        int Tb = 1;
        while (Tb < n) Tb <<= 1;
        if (!b->use_graphs) Tb = n;
        for (int r = 0; r < Tb; r++) {
            const int real = r < n;
            b->hm.tok_ids[r] = real ? items[r].it->tokens[0] : -1;
            b->hm.tok_pos[r] = real ? items[r].pos : 0;
            b->hm.tok_slot[r] = real ? items[r].slot : -1;
            b->hm.item_row0[r] = r;
            b->hm.item_ntok[r] = 1;
            b->hm.item_slot[r] = real ? items[r].slot : -1;
            b->hm.out_rows[r] = r;
            if (real) row_item[r] = r, row_tok[r] = 0;
        }
        rc = run_pass(b, n, Tb, Tb, 1, err, errlen);
        if (!rc) rc = emit_outputs(b, items, row_item, row_tok, n, err, errlen);
        free(row_item);
        return rc;
    }
    /* prompt chunks: passes of at most TM rows; each item contributes one
     * contiguous chunk per pass, in order, so its recurrence stays sequential */
    int *done = (int *)calloc((size_t)n, sizeof(int));
    if (!done) {
        free(row_item);
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    for (;;) {
        int T = 0, ni = 0, no = 0;
        for (int i = 0; i < n && T < b->TM; i++) {
            const kda_batch_item *it = items[i].it;
            const int rem = it->n_tokens - done[i];
            if (rem <= 0) continue;
            const int take = rem < b->TM - T ? rem : b->TM - T;
            b->hm.item_row0[ni] = T;
            b->hm.item_ntok[ni] = take;
            b->hm.item_slot[ni] = items[i].slot;
            ni++;
            for (int k = 0; k < take; k++) {
                const int tk = done[i] + k;
                b->hm.tok_ids[T + k] = it->tokens[tk];
                b->hm.tok_pos[T + k] = items[i].pos + tk;
                b->hm.tok_slot[T + k] = items[i].slot;
                const int is_last = tk == it->n_tokens - 1;
                if (wants_all(it) || (is_last && (it->logits || it->sampling))) {
                    b->hm.out_rows[no] = T + k;
                    row_item[no] = i;
                    row_tok[no] = tk;
                    no++;
                }
            }
            done[i] += take;
            T += take;
        }
        if (T == 0) break;
        rc = run_pass(b, T, ni, no, 0, err, errlen);
        if (!rc && no) rc = emit_outputs(b, items, row_item, row_tok, no, err, errlen);
        if (rc) break;
    }
    free(done);
    free(row_item);
    if (!rc) {
        cudaError_t e = cudaStreamSynchronize(b->st);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "CUDA error %s", cudaGetErrorString(e));
            rc = KDA_EDEVICE;
        }
    }
    return rc;
}

static void cuda_destroy(backend *bb)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (!b) return;
    for (int i = 0; i < N_BUCKETS; i++)
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    kc_gemm_lt_destroy(b->glt);
    if (b->cublas) cublasDestroy(b->cublas);
    if (b->st) cudaStreamDestroy(b->st);
    cudaFree(b->pool);
    cudaFreeHost(b->h_meta);
    free(b->h_table);
    free(b->nblk);
    free(b->free_blocks);
    free(b->lw);
    free(b);
}

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int cuda_backend_create(backend **out, const backend_params *p, char *err, size_t errlen)
{
    *out = NULL;
    if (!cuda_device_available()) {
        snprintf(err, errlen, "no CUDA device available");
        return KDA_EUNSUP;
    }
    const model_config *c = p->cfg;
    const model_weights *W = p->w;
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    b->c = c;
    b->max_seqs = p->max_seqs;
    b->max_seq_len = p->max_seq_len;
    b->D = c->d, b->F = c->ffn, b->vocab = c->vocab, b->L = c->n_layers;
    b->eps = c->norm_eps;
    b->H = c->kda_h, b->K = c->kda_k, b->Vh = c->kda_v, b->taps = c->conv_size;
    b->HK = b->H * b->K, b->HV = b->H * b->Vh;
    b->Hq = c->gqa_h, b->Hkv = c->gqa_kvh, b->hd = c->gqa_hd;
    b->gemv_max_t = env_int("KDA_CUDA_GEMV_MAX_T", 4);
    if (b->gemv_max_t > KC_GEMV_MAX_T) b->gemv_max_t = KC_GEMV_MAX_T;
    b->use_graphs = env_int("KDA_CUDA_GRAPHS", 1);
    for (int l = 0; l < c->n_layers; l++) (c->kind[l] == KDA_LAYER_KDA ? b->n_kda : b->n_gqa)++;
    int rc = KDA_EUNSUP;
    b->R = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (c->kind[l] == KDA_LAYER_KDA) b->R = (int)W->layers[l].kda.f0.rows;
    /* shapes the kernels support */
    if (b->n_kda && (!(b->K == 16 || b->K == 32 || b->K == 64 || b->K == 128) || b->Vh > 128 || b->R > 256 ||
                     b->taps < 1 || b->taps > 4 || b->HV % 8)) {
        snprintf(err, errlen, "CUDA backend: unsupported KDA shape (K=%d V=%d rank=%d conv=%d)", b->K, b->Vh, b->R,
                 b->taps);
        goto fail;
    }
    if (b->n_gqa && (!(b->hd == 16 || b->hd == 32 || b->hd == 64 || b->hd == 128) || b->Hq % b->Hkv ||
                     !((b->Hq / b->Hkv) == 1 || (b->Hq / b->Hkv) == 2 || (b->Hq / b->Hkv) == 4 ||
                       (b->Hq / b->Hkv) == 8))) {
        snprintf(err, errlen, "CUDA backend: unsupported GQA shape (hd=%d Hq=%d Hkv=%d)", b->hd, b->Hq, b->Hkv);
        goto fail;
    }
    if (b->D % 8 || b->F % 8) {
        snprintf(err, errlen, "CUDA backend: hidden and FFN sizes must be multiples of 8");
        goto fail;
    }
    {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
            snprintf(err, errlen, "cudaGetDeviceProperties failed");
            rc = KDA_EDEVICE;
            goto fail;
        }
        snprintf(b->devname, sizeof b->devname, "%s", prop.name);
        /* programmatic dependent launch (sm_90+), eager and captured alike;
         * KDA_PDL=0 turns it off. Measured on the H200 (ceb8d11): B=1 1.81 vs
         * 1.85 ms, B=64 3.30 vs 3.39 ms per step with / without */
        const char *pv = getenv("KDA_PDL");
        b->pdl = prop.major >= 9 && !(pv && strcmp(pv, "0") == 0);
        kc_set_pdl(b->pdl);
    }
    /* projection layouts */
    b->kda_off_f0 = 2 * b->HK + b->HV;
    b->kda_off_g0 = b->kda_off_f0 + b->R;
    b->kda_off_beta = b->kda_off_g0 + b->R;
    b->kda_cols = b->kda_off_beta + b->H;
    b->gqa_off_q = 0;
    b->gqa_off_g = c->output_gate ? b->Hq * b->hd : -1;
    b->gqa_off_k = b->Hq * b->hd * (c->output_gate ? 2 : 1);
    b->gqa_off_v = b->gqa_off_k + b->Hkv * b->hd;
    b->gqa_cols = b->gqa_off_v + b->Hkv * b->hd;
    b->ldp = 2 * b->F;
    if (b->n_kda && b->kda_cols > b->ldp) b->ldp = b->kda_cols;
    if (b->n_gqa && b->gqa_cols > b->ldp) b->ldp = b->gqa_cols;
    b->ldp = (b->ldp + 7) / 8 * 8;
    {
        int tm = 1;
        while (tm < b->max_seqs) tm <<= 1;
        b->TM = tm < 256 ? 256 : tm;
    }
    b->max_blocks = (b->max_seq_len + KV_BLK - 1) / KV_BLK;
    b->kv_layer_elems = (size_t)2 * b->Hkv * KV_BLK * b->hd;
    b->block_elems = b->kv_layer_elems * b->n_gqa;
    /* rounded to 4 floats: the tiled KDA kernel moves the state in 16-byte units */
    b->kda_layer_floats = ((size_t)b->H * b->K * b->Vh + (size_t)(b->taps - 1) * (2 * b->HK + b->HV) + 3) & ~(size_t)3;
    b->slot_floats = b->kda_layer_floats * b->n_kda;
    {
        const int nsplit256 = (b->max_seq_len + 255) / 256;
        b->rs_cap = b->TM * nsplit256 > 2048 ? b->TM * nsplit256 : 2048;
    }
    b->cublas_ws_size = 32u << 20;

    /* ---- size everything, then one cudaMalloc ---- */
    {
        const int D = b->D, F = b->F, TM = b->TM;
        b->lw = (cu_layer *)calloc((size_t)c->n_layers, sizeof(cu_layer));
        if (!b->lw) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "out of host memory");
            goto fail;
        }
        carver cv = {NULL, 0};
        for (int pass = 0; pass < 2; pass++) {
            cv.off = 0;
            size_t mark = 0;
            b->embed = (uint16_t *)carve(&cv, (size_t)b->vocab * D * 2);
            const int tied = W->lm_head.data == W->embed.data;
            b->lm_head = tied ? b->embed : (uint16_t *)carve(&cv, (size_t)b->vocab * D * 2);
            b->final_norm = (float *)carve(&cv, (size_t)D * 4);
            int ik = 0, ig = 0;
            for (int l = 0; l < c->n_layers; l++) {
                cu_layer *w = &b->lw[l];
                const int kda = c->kind[l] == KDA_LAYER_KDA;
                w->n_mix = kda ? b->kda_cols : b->gqa_cols;
                const int ycols = kda ? b->HV : b->Hq * b->hd;
                w->w_mix = (uint16_t *)carve(&cv, (size_t)w->n_mix * D * 2);
                w->w_o = (uint16_t *)carve(&cv, (size_t)D * ycols * 2);
                w->w_gu = (uint16_t *)carve(&cv, (size_t)2 * F * D * 2);
                w->w_down = (uint16_t *)carve(&cv, (size_t)D * F * 2);
                w->attn_norm = (float *)carve(&cv, (size_t)D * 4);
                w->mlp_norm = (float *)carve(&cv, (size_t)D * 4);
                if (kda) {
                    w->kda_idx = ik++;
                    w->convw = (float *)carve(&cv, (size_t)(2 * b->HK + b->HV) * b->taps * 4);
                    w->f1t = (uint16_t *)carve(&cv, (size_t)b->R * b->HK * 2);
                    w->g1t = (uint16_t *)carve(&cv, (size_t)b->R * b->HV * 2);
                    w->g_bias = (float *)carve(&cv, (size_t)b->HV * 4);
                    w->A_log = (float *)carve(&cv, (size_t)b->H * 4);
                    w->dt_bias = (float *)carve(&cv, (size_t)b->HK * 4);
                    w->onorm = (float *)carve(&cv, (size_t)b->Vh * 4);
                } else {
                    w->gqa_idx = ig++;
                    w->q_norm = c->qk_norm ? (float *)carve(&cv, (size_t)b->hd * 4) : NULL;
                    w->k_norm = c->qk_norm ? (float *)carve(&cv, (size_t)b->hd * 4) : NULL;
                }
            }
            b->weight_bytes = cv.off;
            mark = cv.off;
            b->state = (float *)carve(&cv, b->slot_floats * 4 * b->max_seqs);
            b->state_bytes = cv.off - mark;
            mark = cv.off;
            b->h = (float *)carve(&cv, (size_t)TM * D * 4);
            b->proj = (float *)carve(&cv, (size_t)TM * b->ldp * 4);
            b->q = (float *)carve(&cv, (size_t)TM * b->Hq * b->hd * 4 + 4);
            b->lowrank = (float *)carve(&cv, (size_t)TM * (b->HK + b->HV) * 4 + 4);
            b->opart = (float *)carve(&cv, (size_t)b->rs_cap * b->Hq * b->hd * 4 + 4);
            b->ml = (float *)carve(&cv, (size_t)b->rs_cap * b->Hq * 2 * 4 + 4);
            b->logits = (float *)carve(&cv, (size_t)TM * b->vocab * 4);
            b->lse = (float *)carve(&cv, (size_t)TM * 4);
            b->tlp = (float *)carve(&cv, (size_t)TM * 4);
            b->xn = (uint16_t *)carve(&cv, (size_t)TM * D * 2);
            b->act = (uint16_t *)carve(&cv, (size_t)TM * F * 2);
            {
                int yc = b->HV > b->Hq * b->hd ? b->HV : b->Hq * b->hd;
                b->ybuf = (uint16_t *)carve(&cv, (size_t)TM * yc * 2);
            }
            b->d_meta = (int32_t *)carve(&cv, (size_t)9 * TM * 4);
            b->d_sp = (kc_sample_param *)carve(&cv, (size_t)TM * sizeof(kc_sample_param));
            b->hist_cap = (size_t)TM * b->max_seq_len;
            b->d_hist = (int32_t *)carve(&cv, b->hist_cap * 4);
            b->d_scratch = (int *)carve(&cv, (size_t)TM * b->vocab * 4);
            b->d_tok = (int32_t *)carve(&cv, (size_t)TM * 4);
            b->d_lp = (float *)carve(&cv, (size_t)TM * 4);
            b->d_top = (int32_t *)carve(&cv, (size_t)TM * MAX_TOP * 4);
            b->d_toplp = (float *)carve(&cv, (size_t)TM * MAX_TOP * 4);
            b->d_table = (int32_t *)carve(&cv, (size_t)b->max_seqs * b->max_blocks * 4);
            b->cublas_ws = carve(&cv, b->cublas_ws_size);
            b->act_bytes = cv.off - mark;
            if (pass == 0) {
                /* KV gets what the fraction of free memory leaves, capped at max_seqs full contexts */
                size_t free_b = 0, total_b = 0;
                if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
                    rc = KDA_EDEVICE;
                    snprintf(err, errlen, "cudaMemGetInfo failed");
                    goto fail;
                }
                const size_t budget = (size_t)(p->gpu_mem_fraction * (double)free_b);
                const size_t block_bytes = b->n_gqa ? b->block_elems * 2 : 0;
                const size_t want = (size_t)b->max_seqs * b->max_blocks;
                if (cv.off > budget) {
                    rc = KDA_ENOMEM;
                    snprintf(err, errlen,
                             "CUDA pool: weights %zu MiB + state %zu MiB + activations %zu MiB exceed %.0f%% of free "
                             "device memory (%zu MiB); lower --max-seqs or raise the fraction",
                             b->weight_bytes >> 20, b->state_bytes >> 20, b->act_bytes >> 20,
                             p->gpu_mem_fraction * 100, free_b >> 20);
                    goto fail;
                }
                size_t nb = block_bytes ? (budget - cv.off) / (block_bytes + 64) : 0;
                if (nb > want) nb = want;
                if (b->n_gqa && nb < (size_t)b->max_blocks) {
                    rc = KDA_ENOMEM;
                    snprintf(err, errlen, "CUDA pool: room for %zu KV blocks, one full-context sequence needs %d", nb,
                             b->max_blocks);
                    goto fail;
                }
                b->n_blocks = (int)nb;
                b->kv_bytes = nb * block_bytes;
                b->pool_size = cv.off + align_up(b->kv_bytes) + 256;
                cudaError_t e = cudaMalloc((void **)&b->pool, b->pool_size);
                if (e != cudaSuccess) {
                    rc = KDA_ENOMEM;
                    snprintf(err, errlen, "cudaMalloc of the %zu MiB pool failed: %s", b->pool_size >> 20,
                             cudaGetErrorString(e));
                    goto fail;
                }
                cv.base = b->pool;
            }
        }
        b->kv = (uint16_t *)carve(&cv, b->kv_bytes + 16);
    }
    /* host side */
    b->h_table = (int32_t *)calloc((size_t)b->max_seqs * b->max_blocks + 1, 4);
    b->nblk = (int *)calloc((size_t)b->max_seqs, sizeof(int));
    b->free_blocks = (int *)malloc(((size_t)b->n_blocks + 1) * sizeof(int));
    if (!b->h_table || !b->nblk || !b->free_blocks) {
        rc = KDA_ENOMEM;
        snprintf(err, errlen, "out of host memory");
        goto fail;
    }
    for (int i = 0; i < b->n_blocks; i++) b->free_blocks[i] = b->n_blocks - 1 - i;
    b->n_free = b->n_blocks;
    {
        const int TM = b->TM;
        size_t host = (size_t)9 * TM * 4 + (size_t)TM * sizeof(kc_sample_param) + b->hist_cap * 4 +
                      (size_t)TM * 4 * 4 + (size_t)TM * MAX_TOP * 8;
        if (cudaMallocHost((void **)&b->h_meta, host) != cudaSuccess) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "cudaMallocHost failed");
            goto fail;
        }
        int32_t *m = b->h_meta;
        int32_t **hf[9] = {&b->hm.tok_ids, &b->hm.tok_pos, &b->hm.tok_slot, &b->hm.item_row0, &b->hm.item_ntok,
                           &b->hm.item_slot, &b->hm.out_rows, &b->hm.lp_rows, &b->hm.lp_targets};
        int32_t **df[9] = {&b->dm.tok_ids, &b->dm.tok_pos, &b->dm.tok_slot, &b->dm.item_row0, &b->dm.item_ntok,
                           &b->dm.item_slot, &b->dm.out_rows, &b->dm.lp_rows, &b->dm.lp_targets};
        for (int i = 0; i < 9; i++) {
            *hf[i] = m + (size_t)i * TM;
            *df[i] = b->d_meta + (size_t)i * TM;
        }
        char *q = (char *)(m + (size_t)9 * TM);
        b->h_sp = (kc_sample_param *)q, q += (size_t)TM * sizeof(kc_sample_param);
        b->h_hist = (int32_t *)q, q += b->hist_cap * 4;
        b->h_tok = (int32_t *)q, q += (size_t)TM * 4;
        b->h_lp = (float *)q, q += (size_t)TM * 4;
        b->h_tlp = (float *)q, q += (size_t)TM * 4;
        q += (size_t)TM * 4;
        b->h_top = (int32_t *)q, q += (size_t)TM * MAX_TOP * 4;
        b->h_toplp = (float *)q;
    }
    if (cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking) != cudaSuccess ||
        cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(b->cublas, b->cublas_ws, b->cublas_ws_size) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(b->cublas, b->st) != CUBLAS_STATUS_SUCCESS) {
        rc = KDA_EDEVICE;
        snprintf(err, errlen, "CUDA stream / cuBLAS setup failed");
        goto fail;
    }
    cublasSetMathMode(b->cublas, CUBLAS_DEFAULT_MATH);

    /* ---- upload weights ---- */
#define UP(call)                                                                                   \
    do {                                                                                           \
        rc = (call);                                                                               \
        if (rc) goto fail;                                                                         \
    } while (0)
    UP(upload_matrix(b->embed, &W->embed, err, errlen));
    if (b->lm_head != b->embed) UP(upload_matrix(b->lm_head, &W->lm_head, err, errlen));
    UP(upload_f32(b->final_norm, &W->final_norm, b->D, 1.0f, err, errlen));
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *w = &b->lw[l];
        const layer_weights *lw = &W->layers[l];
        const size_t D = b->D;
        UP(upload_f32(w->attn_norm, &lw->attn_norm, D, 1.0f, err, errlen));
        UP(upload_f32(w->mlp_norm, &lw->mlp_norm, D, 1.0f, err, errlen));
        UP(upload_matrix(w->w_gu, &lw->mlp.gate, err, errlen));
        UP(upload_matrix(w->w_gu + (size_t)b->F * D, &lw->mlp.up, err, errlen));
        UP(upload_matrix(w->w_down, &lw->mlp.down, err, errlen));
        if (c->kind[l] == KDA_LAYER_KDA) {
            const kda_layer *k = &lw->kda;
            UP(upload_matrix(w->w_mix, &k->q, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->HK * D, &k->k, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)2 * b->HK * D, &k->v, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->kda_off_f0 * D, &k->f0, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->kda_off_g0 * D, &k->g0, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->kda_off_beta * D, &k->b, err, errlen));
            UP(upload_matrix(w->w_o, &k->o, err, errlen));
            UP(upload_f32(w->convw, &k->q_conv, (size_t)b->HK * b->taps, 0.0f, err, errlen));
            UP(upload_f32(w->convw + (size_t)b->HK * b->taps, &k->k_conv, (size_t)b->HK * b->taps, 0.0f, err, errlen));
            UP(upload_f32(w->convw + (size_t)2 * b->HK * b->taps, &k->v_conv, (size_t)b->HV * b->taps, 0.0f, err,
                          errlen));
            UP(upload_transposed(w->f1t, &k->f1, err, errlen));
            UP(upload_transposed(w->g1t, &k->g1, err, errlen));
            UP(upload_f32(w->g_bias, &k->g1_bias, b->HV, 0.0f, err, errlen));
            UP(upload_f32(w->A_log, &k->A_log, b->H, 0.0f, err, errlen));
            UP(upload_f32(w->dt_bias, &k->dt_bias, b->HK, 0.0f, err, errlen));
            UP(upload_f32(w->onorm, &k->o_norm, b->Vh, 1.0f, err, errlen));
        } else {
            const gqa_layer *g = &lw->gqa;
            UP(upload_matrix(w->w_mix, &g->q, err, errlen));
            if (c->output_gate)
                UP(upload_matrix(w->w_mix + (size_t)b->gqa_off_g * D, &g->gate, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->gqa_off_k * D, &g->k, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)b->gqa_off_v * D, &g->v, err, errlen));
            UP(upload_matrix(w->w_o, &g->o, err, errlen));
            if (c->qk_norm) {
                UP(upload_f32(w->q_norm, &g->q_norm, b->hd, 1.0f, err, errlen));
                UP(upload_f32(w->k_norm, &g->k_norm, b->hd, 1.0f, err, errlen));
            }
        }
    }
#undef UP
    if (cudaMemset(b->state, 0, b->state_bytes) != cudaSuccess || cudaMemset(b->d_table, 0, (size_t)b->max_seqs * b->max_blocks * 4) != cudaSuccess) {
        rc = KDA_EDEVICE;
        snprintf(err, errlen, "cudaMemset failed");
        goto fail;
    }
    /* cublasLt plans for every decode GEMM shape of each graph bucket (T > gemv_max_t) */
    if (env_int("KDA_CUDA_GEMM_LT", 1)) {
        b->glt = kc_gemm_lt_create(b->cublas_ws_size, b->cublas_ws);
        if (b->glt) {
            const int D = b->D, F = b->F, TM = b->TM;
            const int yc = b->HV > b->Hq * b->hd ? b->HV : b->Hq * b->hd;
            int trc = kc_gemm_lt_fill_bf16(b->xn, (size_t)TM * D, 1u, b->st);
            if (!trc) trc = kc_gemm_lt_fill_bf16(b->act, (size_t)TM * F, 2u, b->st);
            if (!trc) trc = kc_gemm_lt_fill_bf16(b->ybuf, (size_t)TM * yc, 3u, b->st);
            for (int Tb = 1; Tb <= TM && !trc; Tb <<= 1) {
                if (Tb <= b->gemv_max_t) continue;
                int done_kda = 0, done_gqa = 0;
                for (int l = 0; l < c->n_layers && !trc; l++) {
                    const int kda = c->kind[l] == KDA_LAYER_KDA;
                    if (kda ? done_kda : done_gqa) continue; /* same shapes as an earlier layer */
                    if (kda)
                        done_kda = 1;
                    else
                        done_gqa = 1;
                    const cu_layer *w = &b->lw[l];
                    const int ycols = kda ? b->HV : b->Hq * b->hd;
                    trc = kc_gemm_lt_tune(b->glt, b->cublas, b->proj, b->ldp, b->xn, D, w->w_mix, Tb, w->n_mix, D,
                                          0.0f, b->st);
                    if (!trc)
                        trc = kc_gemm_lt_tune(b->glt, b->cublas, b->h, D, b->ybuf, ycols, w->w_o, Tb, D, ycols, 1.0f,
                                              b->st);
                }
                const cu_layer *w0 = &b->lw[0];
                if (!trc)
                    trc = kc_gemm_lt_tune(b->glt, b->cublas, b->proj, 2 * F, b->xn, D, w0->w_gu, Tb, 2 * F, D, 0.0f,
                                          b->st);
                if (!trc)
                    trc = kc_gemm_lt_tune(b->glt, b->cublas, b->h, D, b->act, F, w0->w_down, Tb, D, F, 1.0f, b->st);
                if (!trc)
                    trc = kc_gemm_lt_tune(b->glt, b->cublas, b->logits, b->vocab, b->xn, D, b->lm_head, Tb, b->vocab,
                                          D, 0.0f, b->st);
            }
            kc_gemm_lt_release_scratch(b->glt);
            if (trc) { /* tuning failed: keep plain kc_gemm (a device error surfaces in the warm-up below) */
                kc_gemm_lt_destroy(b->glt);
                b->glt = NULL;
            }
            if (cublasSetStream(b->cublas, b->st) != CUBLAS_STATUS_SUCCESS) {
                rc = KDA_EDEVICE;
                snprintf(err, errlen, "cuBLAS setup failed");
                goto fail;
            }
        }
    }

    /* warm-up outside any capture: kernel attributes, cuBLAS heuristics (all rows padding) */
    for (int r = 0; r < b->TM; r++) {
        b->hm.tok_ids[r] = -1, b->hm.tok_pos[r] = 0, b->hm.tok_slot[r] = -1;
        b->hm.item_row0[r] = r, b->hm.item_ntok[r] = 1, b->hm.item_slot[r] = -1, b->hm.out_rows[r] = r;
    }
    for (int T = 1; T <= b->TM; T <<= 1) {
        if ((rc = upload_meta(b, err, errlen)) || (rc = forward(b, T, T, T, attn_split_for(b, T), err, errlen)))
            goto fail;
    }
    if (cudaStreamSynchronize(b->st) != cudaSuccess) {
        rc = KDA_EDEVICE;
        snprintf(err, errlen, "warm-up failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto fail;
    }

    b->base.name = "cuda";
    b->base.seq_reset = cuda_seq_reset;
    b->base.seq_release = cuda_seq_release;
    b->base.seq_reserve = cuda_seq_reserve;
    b->base.step = cuda_step;
    b->base.destroy = cuda_destroy;
    b->base.pool_bytes = b->pool_size;
    b->base.kv_pool_bytes = b->kv_bytes;
    b->base.state_pool_bytes = b->state_bytes;
    b->base.kv_bytes_per_token = b->n_gqa ? b->block_elems * 2 / KV_BLK : 0;
    {
        const int full = b->n_gqa ? b->n_blocks / b->max_blocks : b->max_seqs;
        b->base.max_full_context_seqs = full < b->max_seqs ? full : b->max_seqs;
    }
    b->base.device_name = b->devname;
    {
        const size_t per_seq_state = b->slot_floats * 4, per_seq_kv = (size_t)b->max_blocks * b->block_elems * 2;
        const int full = b->n_gqa ? b->n_blocks / b->max_blocks : b->max_seqs;
        if (p->verbose)
            fprintf(stderr,
                    "cuda: %s, pool %zu MiB: weights %zu MiB, KV %zu MiB (%d blocks x %d tokens, %zu KiB/token), "
                    "KDA state %zu MiB (%d slots x %.1f MiB), activations %zu MiB (%d rows); "
                    "max concurrent sequences at full context (%d tokens): %d; gemv<=%d rows, graphs %s, pdl %s\n",
                    b->devname, b->pool_size >> 20, b->weight_bytes >> 20, b->kv_bytes >> 20, b->n_blocks, KV_BLK,
                    b->n_gqa ? b->block_elems * 2 / KV_BLK / 1024 : 0, b->state_bytes >> 20, b->max_seqs,
                    per_seq_state / 1048576.0, b->act_bytes >> 20, b->TM, b->max_seq_len,
                    full < b->max_seqs ? full : b->max_seqs, b->gemv_max_t, b->use_graphs ? "on" : "off",
                    b->pdl ? "on" : "off");
        (void)per_seq_kv;
    }
    *out = &b->base;
    return 0;
fail:
    cuda_destroy(&b->base);
    return rc ? rc : KDA_EDEVICE;
}
