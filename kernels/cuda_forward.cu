/*
 * cuda_forward.cu - the forward pass over the T rows of one pass whose
 * metadata (cp_meta) is already on the device: embedding, then per layer the
 * mixer's input projections (one GEMM, or the skinny GEMV with the RMSNorm in
 * its prologue at few rows), the fused KDA step or q/k norm + RoPE + KV append
 * + attention, the output projection with the residual added in its epilogue,
 * the MLP; then the final norm and the lm-head for the n_out output rows.
 * Also appends the rows' tokens to their slots' device history (the
 * sampler's penalties read it). Everything is stream-ordered and launch-only:
 * decode buckets capture this function into CUDA graphs.
 */
#include "cuda_internal.h"

int cu_attn_split(const cuda_backend *b, int T)
{
    const int msl = b->d.max_seq_len, forced = b->tn.attn_split;
    if (forced && (long)T * ((msl + forced - 1) / forced) <= b->d.rs_cap) return forced;
    int split = 256;
    while (split > 32 && (long)T * b->d.Hkv * ((msl + split / 2 - 1) / (split / 2)) <= 1024) split /= 2;
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

static int kda_mixer(cuda_backend *b, const cu_layer *w, int T, int n_items, cudaStream_t s)
{
    const cp_dims *d = &b->d;
    kc_kda_args a;
    memset(&a, 0, sizeof a);
    a.proj = b->proj;
    a.ldp = d->ldp;
    a.off_f0 = d->kda_off_f0;
    a.off_g0 = d->kda_off_g0;
    a.off_beta = d->kda_off_beta;
    a.item_row0 = b->dm.item_row0;
    a.item_ntok = b->dm.item_ntok;
    a.item_slot = b->dm.item_slot;
    a.n_items = n_items;
    a.state = b->state + (size_t)w->kda_idx * d->kda_layer_floats;
    a.slot_stride = d->slot_floats;
    a.convw = w->convw;
    a.f1t = w->f1t;
    a.g1t = w->g1t;
    a.g_bias = w->g_bias;
    a.A_log = w->A_log;
    a.dt_bias = w->dt_bias;
    a.onorm = w->onorm;
    a.eps = b->eps;
    a.H = d->H, a.K = d->K, a.V = d->V, a.R = d->R, a.taps = d->taps;
    a.y = b->ybuf;
    a.ldy = d->HV;
    a.lowrank = b->lowrank;
    a.lowrank_rows = T;
    a.tiled = b->tn.kda_tiled;
    a.tile_occ = b->tn.kda_tile_occ;
    a.tile_clusters = b->tn.kda_tile_clusters;
    return kc_kda_step(&a, s);
}

static int gqa_mixer(cuda_backend *b, const cu_layer *w, int T, int split, cudaStream_t s)
{
    const cp_dims *d = &b->d;
    kc_gqa_args a;
    memset(&a, 0, sizeof a);
    a.proj = b->proj;
    a.ldp = d->ldp;
    a.off_q = d->gqa_off_q, a.off_k = d->gqa_off_k, a.off_v = d->gqa_off_v, a.off_gate = d->gqa_off_g;
    a.tok_pos = b->dm.tok_pos;
    a.tok_slot = b->dm.tok_slot;
    a.T = T;
    a.q_norm = w->q_norm, a.k_norm = w->k_norm;
    a.eps = b->eps;
    a.Hq = d->Hq, a.Hkv = d->Hkv, a.hd = d->hd, a.rope_dim = d->rope_dim;
    a.theta = b->c->rope_theta;
    a.q = b->q;
    a.kv = b->kv;
    a.block_stride = d->block_elems;
    a.layer_off = (size_t)w->gqa_idx * d->kv_layer_elems;
    a.blk = KV_BLK;
    a.block_table = b->d_table;
    a.max_blocks = d->max_blocks;
    if (kc_gqa_qkv(&a, s)) return -7;
    const int nsplit = (d->max_seq_len + split - 1) / split;
    return kc_gqa_attn(&a, b->opart, b->ml, nsplit, split, b->ybuf, d->Hq * d->hd, s);
}

int cu_forward(cuda_backend *b, int T, int n_items, int n_out, int split, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    const int D = d->D, F = d->F;
    cudaStream_t s = b->st;
    const int gemv = T <= b->tn.gemv_max_t;
    KC_CHECK(kc_embed(b->h, b->embed, b->dm.tok_ids, T, D, s));
    KC_CHECK(kc_hist_append(b->d_hist, d->max_seq_len, b->dm.tok_ids, b->dm.tok_pos, b->dm.tok_slot, T, s));
    for (int l = 0; l < d->L; l++) {
        const cu_layer *w = &b->lw[l];
        /* mixer input projections (one GEMM for all of them) */
        if (gemv) {
            KC_CHECK(kc_gemv(b->proj, d->ldp, w->w_mix, w->n_mix, D, b->h, D, w->attn_norm, b->eps, T, KC_IN_NORM,
                             KC_OUT_STORE, s));
        } else {
            KC_CHECK(kc_rmsnorm(b->xn, b->h, NULL, w->attn_norm, T, D, b->eps, s));
            KC_CHECK(gemm(b, b->proj, d->ldp, b->xn, D, w->w_mix, T, w->n_mix, D, 0.0f, s));
        }
        const int kda = b->c->kind[l] == KDA_LAYER_KDA;
        if (kda) KC_CHECK(kda_mixer(b, w, T, n_items, s));
        else KC_CHECK(gqa_mixer(b, w, T, split, s));
        const int ycols = kda ? d->HV : d->Hq * d->hd;
        /* output projection, residual added in the epilogue */
        if (gemv)
            KC_CHECK(kc_gemv(b->h, D, w->w_o, D, ycols, b->ybuf, ycols, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        else
            KC_CHECK(gemm(b, b->h, D, b->ybuf, ycols, w->w_o, T, D, ycols, 1.0f, s));
        /* MLP */
        if (gemv) {
            KC_CHECK(kc_gemv(b->act, F, w->w_gu, F, D, b->h, D, w->mlp_norm, b->eps, T, KC_IN_NORM, KC_OUT_SWIGLU, s));
            KC_CHECK(kc_gemv(b->h, D, w->w_down, D, F, b->act, F, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        } else {
            KC_CHECK(kc_rmsnorm(b->xn, b->h, NULL, w->mlp_norm, T, D, b->eps, s));
            KC_CHECK(gemm(b, b->proj, 2 * F, b->xn, D, w->w_gu, T, 2 * F, D, 0.0f, s));
            KC_CHECK(kc_swiglu(b->act, b->proj, T, F, s));
            KC_CHECK(gemm(b, b->h, D, b->act, F, w->w_down, T, D, F, 1.0f, s));
        }
    }
    if (n_out > 0) {
        KC_CHECK(kc_rmsnorm(b->xn, b->h, b->dm.out_rows, b->final_norm, n_out, D, b->eps, s));
        if (n_out <= b->tn.gemv_max_t)
            KC_CHECK(kc_gemv(b->logits, d->vocab, b->lm_head, d->vocab, D, b->xn, D, NULL, 0.0f, n_out, KC_IN_BF16,
                             KC_OUT_STORE, s));
        else
            KC_CHECK(gemm(b, b->logits, d->vocab, b->xn, D, b->lm_head, n_out, d->vocab, D, 0.0f, s));
    }
    return 0;
}
