/*
 * cuda_forward.cu - the forward pass over the T rows of one pass whose
 * metadata (cp_meta) is already on the device: embedding, then per layer the
 * mixer's input projections (one GEMM, or the skinny GEMV with the RMSNorm in
 * its prologue at few rows), the fused KDA step or q/k norm + RoPE + KV append
 * + attention, the output projection with the residual added in its epilogue,
 * the MLP; cu_logits then applies the final norm and the lm-head to a block
 * of output rows. Prompt passes (cu_forward_prefill) take the same GEMMs over
 * many rows with the chunked KDA kernel and the prefill attention instead;
 * a mixed pass puts its one-token items first and runs them through the
 * decode KDA and attention kernels, so decoding sequences and prompt chunks
 * share one read of the weights.
 * Both append the rows' tokens to their slots' device history (the sampler's
 * penalties read it). Everything is stream-ordered and launch-only: decode
 * buckets capture cu_forward + cu_logits into CUDA graphs.
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

/* The rows a prompt pass's GEMMs run on (tuning gemm_pad): T rounded up to
 * 64 (128 above 4096), at most PM (T <= PM). cuBLAS chooses its kernel on the
 * first call of each new shape (~2 ms each on the H200: a fresh server's
 * prompt pass took ~15 ms longer for every new 16-row bucket of T, H200
 * 2026-12-01); with the rows rounded, a weight meets at most 64 + 32 shapes
 * (PM = 8192), all prepared at load (cu_prepare_prompt_gemms), for at most
 * 63 (127) rows of extra work. The inputs' rows T.. hold stale values and
 * their outputs are never read: every GEMM row is independent of the others. */
int cu_gemm_rows(const cuda_backend *b, int T)
{
    if (!b->tn.gemm_pad || T <= 0) return T;
    const int g = T > 4096 ? 128 : 64, r = (T + g - 1) / g * g;
    return r < b->d.PM ? r : b->d.PM;
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

/* the same into a bf16 y (beta 0) */
static int gemm16(cuda_backend *b, uint16_t *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N,
                  int K, cudaStream_t s)
{
    if (b->glt) {
        const int rc = kc_gemm_lt_run_y16(b->glt, y, ldy, x, ldx, W, T, N, K, s);
        if (rc <= 0) return rc;
    }
    return kc_gemm_y16(b->cublas, y, ldy, x, ldx, W, T, N, K, s);
}

/* Every prompt-pass GEMM shape once, at load (the buffers' contents are
 * whatever they hold: only the shapes matter). */
int cu_prepare_prompt_gemms(cuda_backend *b, int *n_shapes)
{
    const cp_dims *d = &b->d;
    const int D = d->D, F = d->F;
    cudaStream_t s = b->st;
    int n = 0;
    for (int T = 1, prev = 0; T <= d->PM; T++) {
        const int Tg = cu_gemm_rows(b, T);
        if (Tg == prev) continue;
        prev = Tg;
        int done_kda = 0, done_gqa = 0;
        for (int l = 0; l < d->L; l++) {
            const int kda = b->c->kind[l] == KDA_LAYER_KDA;
            if (kda ? done_kda : done_gqa) continue; /* the same shapes as an earlier layer */
            (kda ? done_kda : done_gqa) = 1;
            const cu_layer *w = &b->lw[l];
            const int ycols = kda ? d->HV : d->Hq * d->hd;
            if (gemm(b, b->proj, d->ldp, b->xn, D, w->w_mix, Tg, w->n_mix, D, 0.0f, s) ||
                gemm(b, b->h, D, b->ybuf, ycols, w->w_o, Tg, D, ycols, 1.0f, s))
                return -7;
            if (kda && (gemm(b, b->lowrank, d->HK + d->HV, b->lowin, 2 * d->R, w->f1, Tg, d->HK, d->R, 0.0f, s) ||
                        gemm(b, b->lowrank + d->HK, d->HK + d->HV, b->lowin + d->R, 2 * d->R, w->g1, Tg, d->HV, d->R,
                             0.0f, s)))
                return -7;
        }
        if ((cu_gu_bf16(b, &b->lw[0]) ? gemm16(b, (uint16_t *)b->proj, 2 * F, b->xn, D, b->lw[0].w_gu, Tg, 2 * F, D, s)
                                   : gemm(b, b->proj, 2 * F, b->xn, D, b->lw[0].w_gu, Tg, 2 * F, D, 0.0f, s)) ||
            gemm(b, b->h, D, b->act, F, b->lw[0].w_down, Tg, D, F, 1.0f, s))
            return -7;
        n++;
    }
    *n_shapes = n;
    return cudaStreamSynchronize(s) == cudaSuccess ? 0 : -7;
}

/* rows [0, T) belong to items [0, n_items). Models with GVA, conv biases or
 * no short conv run the conv as its own pass first (kc_kda_conv, in place on
 * proj) and the step kernel reads the activated q | k | v. */
static int kda_mixer_on(cuda_backend *b, const cu_layer *w, int T, int n_items, float *lowrank, int stream_blocks,
                        cudaStream_t s)
{
    const model_config *c = b->c;
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
    a.state_bf16 = d->state_bf16;
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
    a.group = d->H / d->Hqk;
    a.lower_bound = c->gate == KDA_GATE_LOWER_BOUND ? c->gate_lower_bound : 0.0f;
    a.neg_eigval = c->beta_scale != 1.0f;
    a.y = b->ybuf;
    a.ldy = d->HV;
    a.lowrank = lowrank;
    a.lowrank_rows = T;
    a.stream_blocks = stream_blocks;
    /* T rows of T items: one token each (a decode step, or a pass's decode rows) */
    a.stream = T == n_items && b->tn.kda_stream > 0 && n_items >= b->tn.kda_stream;
    if (b->kda_preconv) {
        a.convw = c->short_conv ? w->convw : NULL;
        a.conv_bias = w->conv_bias;
        if (kc_kda_conv(&a, s)) return -7;
        a.preconv = 1;
    }
    return kc_kda_step(&a, s);
}

static int kda_mixer(cuda_backend *b, const cu_layer *w, int T, int n_items, cudaStream_t s)
{
    return kda_mixer_on(b, w, T, n_items, b->lowrank, 0, s);
}

/* the attention layer's kernel arguments over the pass's T rows (both paths) */
static void gqa_args(const cuda_backend *b, const cu_layer *w, int T, kc_gqa_args *a)
{
    const cp_dims *d = &b->d;
    memset(a, 0, sizeof *a);
    a->proj = b->proj;
    a->ldp = d->ldp;
    a->off_q = d->gqa_off_q, a->off_k = d->gqa_off_k, a->off_v = d->gqa_off_v, a->off_gate = d->gqa_off_g;
    a->tok_pos = b->dm.tok_pos;
    a->tok_slot = b->dm.tok_slot;
    a->T = T;
    a->q_norm = w->q_norm, a->k_norm = w->k_norm;
    a->eps = b->c->qk_norm_eps; /* the q/k norm's own eps (llama qk_norm_eps; else norm_eps) */
    a->Hq = d->Hq, a->Hkv = d->Hkv, a->hd = d->hd, a->rope_dim = d->rope_dim;
    a->theta = b->c->rope_theta;
    a->rope_inv_freq = b->rope_inv;
    a->window = b->c->window;
    a->q = b->q;
    a->kv = b->kv;
    a->block_stride = d->block_elems;
    a->layer_off = (size_t)w->gqa_idx * d->kv_layer_elems;
    a->blk = KV_BLK;
    a->block_table = b->d_table;
    a->max_blocks = d->max_blocks;
}

static int gqa_mixer(cuda_backend *b, const cu_layer *w, int T, int split, cudaStream_t s)
{
    const cp_dims *d = &b->d;
    kc_gqa_args a;
    gqa_args(b, w, T, &a);
    if (kc_gqa_qkv(&a, s)) return -7;
    const int nsplit = (d->max_seq_len + split - 1) / split;
    return kc_gqa_attn(&a, b->opart, b->ml, nsplit, split, b->ybuf, d->Hq * d->hd, s);
}

/* The MLP block on T rows: RMSNorm, gate|up GEMM (or the GEMV with the norm
 * in its prologue and SwiGLU in its epilogue), down projection added to h. */
static int mlp_block(cuda_backend *b, const cu_layer *w, int T, int Tg, int gemv, char *err, size_t errlen)
{
    const int D = b->d.D, F = b->d.F;
    cudaStream_t s = b->st;
    if (gemv && !w->gu_bias) {
        KC_CHECK(kc_gemv(b->act, F, w->w_gu, F, D, b->h, D, w->mlp_norm, b->eps, T, KC_IN_NORM, KC_OUT_SWIGLU, s));
        KC_CHECK(kc_gemv(b->h, D, w->w_down, D, F, b->act, F, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        PROF(b, KDA_PROF_GEMM);
    } else if (gemv) { /* mlp_bias: gate|up stored, biased, then SwiGLU; the down bias after the residual add */
        KC_CHECK(kc_gemv(b->proj, 2 * F, w->w_gu, 2 * F, D, b->h, D, w->mlp_norm, b->eps, T, KC_IN_NORM,
                         KC_OUT_STORE, s));
        KC_CHECK(kc_add_bias(b->proj, 2 * F, w->gu_bias, T, 2 * F, s));
        KC_CHECK(kc_swiglu(b->act, b->proj, T, F, s));
        KC_CHECK(kc_gemv(b->h, D, w->w_down, D, F, b->act, F, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        KC_CHECK(kc_add_bias(b->h, D, w->down_bias, T, D, s));
        PROF(b, KDA_PROF_GEMM);
    } else {
        KC_CHECK(kc_rmsnorm(b->xn, b->h, NULL, w->mlp_norm, T, D, b->eps, s));
        PROF(b, KDA_PROF_OTHER);
        if (cu_gu_bf16(b, w)) { /* bf16 gate|up in proj's memory */
            KC_CHECK(gemm16(b, (uint16_t *)b->proj, 2 * F, b->xn, D, w->w_gu, Tg, 2 * F, D, s));
            PROF(b, KDA_PROF_GEMM);
            KC_CHECK(kc_swiglu_bf16(b->act, (const uint16_t *)b->proj, T, F, s));
        } else {
            KC_CHECK(gemm(b, b->proj, 2 * F, b->xn, D, w->w_gu, Tg, 2 * F, D, 0.0f, s));
            PROF(b, KDA_PROF_GEMM);
            if (w->gu_bias) KC_CHECK(kc_add_bias(b->proj, 2 * F, w->gu_bias, T, 2 * F, s));
            KC_CHECK(kc_swiglu(b->act, b->proj, T, F, s));
        }
        PROF(b, KDA_PROF_OTHER);
        KC_CHECK(gemm(b, b->h, D, b->act, F, w->w_down, Tg, D, F, 1.0f, s));
        if (w->down_bias) KC_CHECK(kc_add_bias(b->h, D, w->down_bias, T, D, s));
        PROF(b, KDA_PROF_GEMM);
    }
    return 0;
}

int cu_forward(cuda_backend *b, int T, int n_items, int split, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    const int D = d->D;
    cudaStream_t s = b->st;
    const int gemv = T <= b->tn.gemv_max_t;
    PROF(b, -1);
    KC_CHECK(kc_embed(b->h, b->embed, b->dm.tok_ids, T, D, s));
    KC_CHECK(kc_hist_append(b->d_hist, d->max_seq_len, b->dm.tok_ids, b->dm.tok_pos, b->dm.tok_slot, T, s));
    PROF(b, KDA_PROF_OTHER);
    for (int l = 0; l < d->L; l++) {
        const cu_layer *w = &b->lw[l];
        /* mixer input projections (one GEMM for all of them) */
        if (gemv) {
            KC_CHECK(kc_gemv(b->proj, d->ldp, w->w_mix, w->n_mix, D, b->h, D, w->attn_norm, b->eps, T, KC_IN_NORM,
                             KC_OUT_STORE, s));
        } else {
            KC_CHECK(kc_rmsnorm(b->xn, b->h, NULL, w->attn_norm, T, D, b->eps, s));
            PROF(b, KDA_PROF_OTHER);
            KC_CHECK(gemm(b, b->proj, d->ldp, b->xn, D, w->w_mix, T, w->n_mix, D, 0.0f, s));
        }
        if (w->mix_bias) KC_CHECK(kc_add_bias(b->proj, d->ldp, w->mix_bias, T, w->n_mix, s));
        PROF(b, KDA_PROF_GEMM);
        const int kda = b->c->kind[l] == KDA_LAYER_KDA;
        if (kda) KC_CHECK(kda_mixer(b, w, T, n_items, s));
        else KC_CHECK(gqa_mixer(b, w, T, split, s));
        PROF(b, kda ? KDA_PROF_KDA : KDA_PROF_ATTN);
        const int ycols = kda ? d->HV : d->Hq * d->hd;
        /* output projection, residual added in the epilogue */
        if (gemv)
            KC_CHECK(kc_gemv(b->h, D, w->w_o, D, ycols, b->ybuf, ycols, NULL, 0.0f, T, KC_IN_BF16, KC_OUT_ADD, s));
        else
            KC_CHECK(gemm(b, b->h, D, b->ybuf, ycols, w->w_o, T, D, ycols, 1.0f, s));
        if (w->o_bias) KC_CHECK(kc_add_bias(b->h, D, w->o_bias, T, D, s));
        PROF(b, KDA_PROF_GEMM);
        int rc = mlp_block(b, w, T, T, gemv, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

int cu_logits(cuda_backend *b, int k0, int n, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    cudaStream_t s = b->st;
    if (n <= 0) return 0;
    PROF(b, -1);
    KC_CHECK(kc_rmsnorm(b->xn, b->h, b->dm.out_rows + k0, b->final_norm, n, d->D, b->eps, s));
    PROF(b, KDA_PROF_OTHER);
    if (n <= b->tn.gemv_max_t)
        KC_CHECK(kc_gemv(b->logits, d->vocab, b->lm_head, d->vocab, d->D, b->xn, d->D, NULL, 0.0f, n, KC_IN_BF16,
                         KC_OUT_STORE, s));
    else
        KC_CHECK(gemm(b, b->logits, d->vocab, b->xn, d->D, b->lm_head, n, d->vocab, d->D, 0.0f, s));
    PROF(b, KDA_PROF_LMHEAD);
    return 0;
}

/* ---- prompt passes: thousands of rows of many items at once ---- */

/* A mixed step's two streams (tuning mixed_reserve): st2 starts after the
 * work enqueued on st so far; st continues after st2's last work
 * (ev_join recorded there). Only st2 ever waits for ev_fork and only st for
 * ev_join, so one pair of events serves every layer. No cuBLAS call runs on
 * st2 (the handle's stream and workspace stay st's). */
static int fork_side(cuda_backend *b)
{
    return cudaEventRecord(b->ev_fork, b->st) == cudaSuccess && cudaStreamWaitEvent(b->st2, b->ev_fork, 0) == cudaSuccess
               ? 0
               : -7;
}
static int join_side(cuda_backend *b)
{
    return cudaStreamWaitEvent(b->st, b->ev_join, 0) == cudaSuccess ? 0 : -7;
}

/* Items [i0, n_items) of the pass through the chunked kernel; the low-rank
 * GEMMs cover all T rows (the decode kernel of items [0, i0), which ran
 * before in stream order, is done with the scratch they overwrite). */
static int kda_mixer_prefill(cuda_backend *b, const cu_layer *w, int T, int i0, int n_items, int planned, char *err,
                             size_t errlen)
{
    const cp_dims *d = &b->d;
    cudaStream_t s = b->st;
    /* the low-rank gate and output-gate inputs: f0 | g0 (adjacent columns of
     * proj) to bf16, then two tensor-core GEMMs into lowrank [T, HK + HV] */
    const int lw = d->HK + d->HV, Tg = cu_gemm_rows(b, T);
    KC_CHECK(kc_cast_bf16(b->lowin, 2 * d->R, b->proj + d->kda_off_f0, d->ldp, T, 2 * d->R, s));
    PROF(b, KDA_PROF_KDA);
    KC_CHECK(gemm(b, b->lowrank, lw, b->lowin, 2 * d->R, w->f1, Tg, d->HK, d->R, 0.0f, s));
    KC_CHECK(gemm(b, b->lowrank + d->HK, lw, b->lowin + d->R, 2 * d->R, w->g1, Tg, d->HV, d->R, 0.0f, s));
    PROF(b, KDA_PROF_GEMM);
    kc_kda_chunk_args a;
    memset(&a, 0, sizeof a);
    a.proj = b->proj;
    a.ldp = d->ldp;
    a.off_beta = d->kda_off_beta;
    a.lowrank = b->lowrank;
    a.item_row0 = b->dm.item_row0 + i0;
    a.item_ntok = b->dm.item_ntok + i0;
    a.item_slot = b->dm.item_slot + i0;
    a.n_items = n_items - i0;
    a.T = T;
    a.state = b->state + (size_t)w->kda_idx * d->kda_layer_floats;
    a.state_bf16 = d->state_bf16;
    a.slot_stride = d->slot_floats;
    a.convw = w->convw;
    a.g_bias = w->g_bias;
    a.A_log = w->A_log;
    a.dt_bias = w->dt_bias;
    a.onorm = w->onorm;
    a.eps = b->eps;
    a.H = d->H, a.K = d->K, a.V = d->V, a.taps = d->taps;
    a.y = b->ybuf;
    a.ldy = d->HV;
    a.work = b->kda_ws;
    a.work_bytes = d->kda_chunk_ws;
    a.gemm = b->tn.kda_chunk_gemm;
    a.bv = b->tn.kda_chunk_bv;
    a.seq_split = b->tn.kda_chunk_split;
    /* the pass's first KDA layer plans the chunk table, the others reuse it (same items,
     * T, workspace; only kc_kda_chunk writes there) */
    a.plan_ready = planned;
    KC_CHECK(kc_kda_chunk(&a, s));
    PROF(b, KDA_PROF_KDA);
    return 0;
}

/* q/k norm, RoPE and the K/V append for all T rows; rows [0, n_dec) (items
 * [0, n_dec), one token each) through the decode attention, the other items
 * through the prefill attention. */
static int gqa_mixer_prefill(cuda_backend *b, const cu_layer *w, int T, int n_dec, int n_items, int max_ctx,
                             int side, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    kc_gqa_args a;
    gqa_args(b, w, T, &a);
    KC_CHECK(kc_gqa_qkv(&a, b->st)); /* q/k norm + RoPE, K/V appended to the cache */
    if (n_dec) {
        const int split = cu_attn_split(b, n_dec), nsplit = (d->max_seq_len + split - 1) / split;
        a.T = n_dec;
        if (side) KC_CHECK(fork_side(b));
        KC_CHECK(kc_gqa_attn(&a, b->opart, b->ml, nsplit, split, b->ybuf, d->Hq * d->hd, side ? b->st2 : b->st));
        if (side) KC_CHECK(cudaEventRecord(b->ev_join, b->st2) == cudaSuccess ? 0 : -7);
        a.T = T;
    }
    const kc_attn_prefill_tuning tune = {.variant = b->tn.attn_prefill_variant,
                                         .split_keys = b->tn.attn_prefill_split};
    if (n_items > n_dec)
        KC_CHECK(kc_attn_prefill(&a, b->dm.item_row0 + n_dec, b->dm.item_ntok + n_dec, b->dm.item_pos0 + n_dec,
                                 b->dm.item_slot + n_dec, n_items - n_dec, max_ctx, b->ybuf, d->Hq * d->hd, b->attn_ws,
                                 d->attn_prefill_ws, &tune, b->st));
    if (side && n_dec) KC_CHECK(join_side(b));
    PROF(b, KDA_PROF_ATTN);
    return 0;
}

int cu_forward_prefill(cuda_backend *b, int T, int n_items, int n_dec, int max_ctx, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    const int D = d->D, Tg = cu_gemm_rows(b, T);
    cudaStream_t s = b->st;
    /* decode rows and prompt items side by side (tuning mixed_reserve; the
     * profile's per-kind split needs one stream) */
    const int side = n_dec > 0 && n_items > n_dec && b->tn.mixed_reserve > 0 && !b->prof_on;
    const int stream_blocks = b->sms - b->tn.mixed_reserve > 0 ? b->sms - b->tn.mixed_reserve : 1;
    int planned = 0; /* KDA layers run through the chunked kernel so far */
    PROF(b, -1);
    KC_CHECK(kc_embed(b->h, b->embed, b->dm.tok_ids, T, D, s));
    KC_CHECK(kc_hist_append(b->d_hist, d->max_seq_len, b->dm.tok_ids, b->dm.tok_pos, b->dm.tok_slot, T, s));
    PROF(b, KDA_PROF_OTHER);
    for (int l = 0; l < d->L; l++) {
        const cu_layer *w = &b->lw[l];
        KC_CHECK(kc_rmsnorm(b->xn, b->h, NULL, w->attn_norm, T, D, b->eps, s));
        PROF(b, KDA_PROF_OTHER);
        KC_CHECK(gemm(b, b->proj, d->ldp, b->xn, D, w->w_mix, Tg, w->n_mix, D, 0.0f, s));
        if (w->mix_bias) KC_CHECK(kc_add_bias(b->proj, d->ldp, w->mix_bias, T, w->n_mix, s));
        PROF(b, KDA_PROF_GEMM);
        const int kda = b->c->kind[l] == KDA_LAYER_KDA;
        int rc = 0;
        if (kda && n_dec && side) { /* the one-token items beside the prompt items, on SMs of their own */
            KC_CHECK(fork_side(b));
            KC_CHECK(kda_mixer_on(b, w, n_dec, n_dec, b->lowrank_dec, stream_blocks, b->st2));
            KC_CHECK(cudaEventRecord(b->ev_join, b->st2) == cudaSuccess ? 0 : -7);
        } else if (kda && n_dec) { /* the one-token items through the decode step kernel first */
            KC_CHECK(kda_mixer(b, w, n_dec, n_dec, s));
            PROF(b, KDA_PROF_KDA);
        }
        if (kda && n_items > n_dec) rc = kda_mixer_prefill(b, w, T, n_dec, n_items, planned++ > 0, err, errlen);
        if (!rc && kda && n_dec && side && join_side(b)) rc = KDA_EDEVICE;
        if (!kda) rc = gqa_mixer_prefill(b, w, T, n_dec, n_items, max_ctx, side, err, errlen);
        if (rc) return rc;
        const int ycols = kda ? d->HV : d->Hq * d->hd;
        KC_CHECK(gemm(b, b->h, D, b->ybuf, ycols, w->w_o, Tg, D, ycols, 1.0f, s));
        if (w->o_bias) KC_CHECK(kc_add_bias(b->h, D, w->o_bias, T, D, s));
        PROF(b, KDA_PROF_GEMM);
        if ((rc = mlp_block(b, w, T, Tg, 0, err, errlen))) return rc;
    }
    return 0;
}
