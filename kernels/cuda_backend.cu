/*
 * cuda_backend.cu - the CUDA backend's create / destroy and sequence calls.
 * One device pool (sizes and offsets from the planner, cuda_plan.c) holds
 * the weights (uploaded once, cuda_weights.cu), the KDA state slots, the
 * activations and the paged GQA KV cache; steps run in cuda_step.cu over the
 * forward pass of cuda_forward.cu. Nothing is allocated after create.
 * Tuning (engine.h kda_tuning) is read here once and passed down.
 */
#include "cuda_internal.h"

static_assert(sizeof(kc_sample_param) <= 128, "cuda_plan.c reserves 128 bytes per sample parameter");
static_assert(sizeof(kc_logit_bias) == sizeof(kda_logit_bias), "kc_logit_bias mirrors kda_logit_bias");

int cuda_device_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* ---- profile (tuning prof=1) ---- */

void cu_prof_mark(cuda_backend *b, int kind)
{
    if (b->prof_n == CU_PROF_MAX) { /* full: fold what is there, keep the last mark as the new start */
        cudaEventSynchronize(b->prof_ev[b->prof_n - 1]);
        cu_prof_fold(b);
    }
    if (b->prof_n == 0) { /* the start of this run of marks */
        cudaEventRecord(b->prof_ev[0], b->st);
        b->prof_kind[0] = KDA_PROF_OTHER;
        b->prof_n = 1;
        if (kind < 0) return;
    }
    /* kind < 0: a new start (the device may have idled since: not counted) */
    b->prof_kind[b->prof_n] = (unsigned char)(kind < 0 ? KDA_PROF_N : kind);
    cudaEventRecord(b->prof_ev[b->prof_n++], b->st);
}

void cu_prof_fold(cuda_backend *b)
{
    for (int i = 1; i < b->prof_n; i++) {
        float ms = 0;
        if (b->prof_kind[i] < KDA_PROF_N && cudaEventElapsedTime(&ms, b->prof_ev[i - 1], b->prof_ev[i]) == cudaSuccess)
            b->prof_ms[b->prof_kind[i]] += ms;
    }
    if (b->prof_n) { /* the last event starts the next run */
        cudaEvent_t t = b->prof_ev[0];
        b->prof_ev[0] = b->prof_ev[b->prof_n - 1];
        b->prof_ev[b->prof_n - 1] = t;
        b->prof_n = 1;
    }
    cudaGetLastError();
}

static void cuda_prof_take(backend *bb, kda_prof *out)
{
    cuda_backend *b = (cuda_backend *)bb;
    for (int k = 0; k < KDA_PROF_N; k++) out->ms[k] = b->prof_ms[k], b->prof_ms[k] = 0;
    out->steps = b->prof_steps;
    b->prof_steps = 0;
}

/* ---- sequences ---- */

/* Mirrors table entries [first, last) of slot to the device, stream-ordered
 * ahead of any step that reads them. */
static int table_upload(cuda_backend *b, int slot, int first, int last, char *err, size_t errlen)
{
    if (last <= first) return 0;
    const size_t row = (size_t)slot * b->d.max_blocks;
    CK(cudaMemcpyAsync(b->d_table + row + first, b->ka.table + row + first, (size_t)(last - first) * 4,
                       cudaMemcpyHostToDevice, b->st));
    return 0;
}

static int cuda_seq_reserve(backend *bb, int slot, int n_tokens, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (!b->d.n_gqa) return 0;
    int first, last;
    if (kv_alloc_reserve(&b->ka, slot, n_tokens, &first, &last)) {
        const int need = (n_tokens + KV_BLK - 1) / KV_BLK - b->ka.nblk[slot];
        snprintf(err, errlen, "KV cache full: %d tokens need %d more blocks of %d tokens, %d free", n_tokens, need,
                 KV_BLK, b->ka.n_free);
        return KDA_ENOMEM;
    }
    return table_upload(b, slot, first, last, err, errlen);
}

static void cuda_seq_release(backend *bb, int slot)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (b->d.n_gqa) kv_alloc_release(&b->ka, slot);
}

static int cuda_seq_reset(backend *bb, int slot, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    cuda_seq_release(bb, slot);
    CK(cudaMemsetAsync(b->state + (size_t)slot * b->d.slot_floats, 0, b->d.slot_floats * sizeof(float), b->st));
    CK(cudaStreamSynchronize(b->st));
    return 0;
}

static size_t cuda_kv_bytes_used(const backend *bb)
{
    const cuda_backend *b = (const cuda_backend *)bb;
    return (size_t)(kv_alloc_used(&b->ka) - b->ka.n_snap_only) * b->d.block_elems * 2;
}

/* ---- prefix snapshots (engine.h): the state slot copied on the device, the
 * KV blocks referenced (kv_alloc), nothing copied back to the host ---- */

static int cuda_snap_take(backend *bb, int slot, int n_tokens, int snap, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    const size_t sf = b->d.slot_floats;
    CK(cudaMemcpyAsync(b->snap_state + (size_t)snap * sf, b->state + (size_t)slot * sf, sf * sizeof(float),
                       cudaMemcpyDeviceToDevice, b->st));
    b->snap_nb[snap] = b->d.n_gqa ? kv_alloc_snap_ref(&b->ka, slot, n_tokens, b->snap_blocks + (size_t)snap * b->d.max_blocks) : 0;
    b->n_snaps_live++;
    return 0;
}

static int cuda_snap_restore(backend *bb, int snap, int slot, int n_tokens, const int32_t *hist, char *err,
                             size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    const size_t sf = b->d.slot_floats;
    if (b->d.n_gqa) {
        kv_alloc_release(&b->ka, slot);
        int from, to, last;
        if (kv_alloc_restore(&b->ka, slot, b->snap_blocks + (size_t)snap * b->d.max_blocks, n_tokens, &from, &to,
                             &last)) {
            snprintf(err, errlen, "KV cache full: no block free for the last %d tokens of a %d-token prefix",
                     n_tokens % KV_BLK, n_tokens);
            return KDA_ENOMEM;
        }
        /* the partial last block is this slot's own copy: it appends there */
        const size_t blk = b->d.block_elems;
        if (from >= 0)
            CK(cudaMemcpyAsync(b->kv + (size_t)to * blk, b->kv + (size_t)from * blk, blk * 2, cudaMemcpyDeviceToDevice,
                               b->st));
        int rc = table_upload(b, slot, 0, last, err, errlen);
        if (rc) return rc;
    }
    CK(cudaMemcpyAsync(b->state + (size_t)slot * sf, b->snap_state + (size_t)snap * sf, sf * sizeof(float),
                       cudaMemcpyDeviceToDevice, b->st));
    /* the sampler's penalties read the device history */
    CK(cudaMemcpyAsync(b->d_hist + (size_t)slot * b->d.max_seq_len, hist, (size_t)n_tokens * sizeof(int32_t),
                       cudaMemcpyHostToDevice, b->st));
    CK(cudaStreamSynchronize(b->st));
    return 0;
}

static void cuda_snap_drop(backend *bb, int snap)
{
    cuda_backend *b = (cuda_backend *)bb;
    kv_alloc_snap_unref(&b->ka, b->snap_blocks + (size_t)snap * b->d.max_blocks, b->snap_nb[snap]);
    b->snap_nb[snap] = 0;
    b->n_snaps_live--;
}

static size_t cuda_cache_bytes(const backend *bb)
{
    const cuda_backend *b = (const cuda_backend *)bb;
    return (size_t)b->n_snaps_live * b->d.slot_floats * sizeof(float) +
           (size_t)b->ka.n_snap_only * b->d.block_elems * 2;
}

static void cuda_destroy(backend *bb)
{
    cuda_backend *b = (cuda_backend *)bb;
    if (!b) return;
    for (int i = 0; i < CP_N_BUCKETS; i++)
        if (b->graph[i]) cudaGraphExecDestroy(b->graph[i]);
    for (int i = 0; b->prof_ev && i < CU_PROF_MAX; i++)
        if (b->prof_ev[i]) cudaEventDestroy(b->prof_ev[i]);
    free(b->prof_ev);
    free(b->prof_kind);
    kc_gemm_lt_destroy(b->glt);
    if (b->cublas) cublasDestroy(b->cublas);
    if (b->st) cudaStreamDestroy(b->st);
    if (b->st2) cudaStreamDestroy(b->st2);
    if (b->ev_fork) cudaEventDestroy(b->ev_fork);
    if (b->ev_join) cudaEventDestroy(b->ev_join);
    cudaFree(b->pool);
    cudaFreeHost(b->h_meta);
    kv_alloc_free(&b->ka);
    free(b->snap_blocks);
    free(b->snap_nb);
    free(b->row_item);
    free(b->done);
    free(b->split_items);
    free(b->lw);
    free(b);
}

/* ---- create ---- */

/* Device pointers from the layout (lo.* are byte offsets into the pool). */
static void carve(cuda_backend *b)
{
    const cp_layout *lo = &b->lo;
    char *p = b->pool;
#define AT(T, off) ((T *)(p + (off)))
    b->embed = AT(uint16_t, lo->embed);
    b->lm_head = AT(uint16_t, lo->lm_head);
    b->final_norm = AT(float, lo->final_norm);
    b->rope_inv = b->d.n_gqa ? AT(double, lo->rope_inv) : NULL;
    for (int l = 0, ik = 0, ig = 0; l < b->d.L; l++) {
        cu_layer *w = &b->lw[l];
        const cp_layer_off *o = &lo->layer[l];
        w->n_mix = o->n_mix;
        w->w_mix = AT(uint16_t, o->w_mix), w->w_o = AT(uint16_t, o->w_o);
        w->w_gu = AT(uint16_t, o->w_gu), w->w_down = AT(uint16_t, o->w_down);
        w->attn_norm = AT(float, o->attn_norm), w->mlp_norm = AT(float, o->mlp_norm);
        w->gu_bias = b->c->mlp_bias ? AT(float, o->gu_bias) : NULL;
        w->down_bias = b->c->mlp_bias ? AT(float, o->down_bias) : NULL;
        if (b->c->kind[l] == KDA_LAYER_KDA) {
            w->kda_idx = ik++;
            w->convw = AT(float, o->convw);
            w->conv_bias = b->c->conv_bias ? AT(float, o->conv_bias) : NULL;
            w->f1t = AT(uint16_t, o->f1t), w->g1t = AT(uint16_t, o->g1t);
            w->g_bias = AT(float, o->g_bias), w->A_log = AT(float, o->A_log);
            w->dt_bias = AT(float, o->dt_bias), w->onorm = AT(float, o->onorm);
            w->f1 = AT(uint16_t, o->f1), w->g1 = AT(uint16_t, o->g1);
        } else {
            w->gqa_idx = ig++;
            w->q_norm = b->c->qk_norm ? AT(float, o->q_norm) : NULL;
            w->k_norm = b->c->qk_norm ? AT(float, o->k_norm) : NULL;
            w->mix_bias = b->c->qkv_bias ? AT(float, o->mix_bias) : NULL;
            w->o_bias = b->c->o_bias ? AT(float, o->o_bias) : NULL;
        }
    }
    b->state = AT(float, lo->state);
    b->snap_state = AT(float, lo->snap_state);
    b->h = AT(float, lo->h), b->proj = AT(float, lo->proj), b->q = AT(float, lo->q);
    b->lowrank = AT(float, lo->lowrank), b->opart = AT(float, lo->opart), b->ml = AT(float, lo->ml);
    b->lowrank_dec = AT(float, lo->lowrank_dec);
    b->logits = AT(float, lo->logits), b->lse = AT(float, lo->lse), b->tlp = AT(float, lo->tlp);
    b->xn = AT(uint16_t, lo->xn), b->act = AT(uint16_t, lo->act), b->ybuf = AT(uint16_t, lo->ybuf);
    b->lowin = AT(uint16_t, lo->lowin);
    b->kda_ws = b->d.kda_chunk_ws ? p + lo->kda_ws : NULL;
    b->attn_ws = b->d.attn_prefill_ws ? p + lo->attn_ws : NULL;
    b->d_meta = AT(int32_t, lo->meta);
    b->d_sp = AT(kc_sample_param, lo->sample_params);
    b->d_hist = AT(int32_t, lo->hist);
    b->d_scratch = AT(int, lo->scratch);
    b->d_tok = AT(int32_t, lo->tok), b->d_lp = AT(float, lo->lp);
    b->d_top = AT(int32_t, lo->top), b->d_toplp = AT(float, lo->toplp);
    b->d_ptop = AT(int32_t, lo->ptop), b->d_ptoplp = AT(float, lo->ptoplp);
    b->d_bias = AT(kda_logit_bias, lo->bias);
    b->d_table = AT(int32_t, lo->table);
    b->cublas_ws = p + lo->cublas_ws;
    b->kv = AT(uint16_t, lo->kv);
#undef AT
    cp_meta_carve(&b->dm_dec, b->d_meta, b->d.TM);
    cp_meta_carve(&b->dm_pre, b->d_meta + (size_t)CP_META_ARRAYS * b->d.TM, b->d.PM);
}

/* Pinned host buffers: step metadata and what comes back from the device. */
static int host_buffers(cuda_backend *b, char *err, size_t errlen)
{
    const size_t TM = (size_t)b->d.TM, PM = (size_t)b->d.PM, vocab = (size_t)b->d.vocab;
    const size_t bytes = CP_META_ARRAYS * (TM + PM) * 4 + TM * sizeof(kc_sample_param) +
                         TM * KDA_MAX_LOGIT_BIAS * sizeof(kda_logit_bias) + TM * 4 * 3 + TM * KDA_MAX_TOP * 16 +
                         CU_HOST_ROWS * vocab * 4 + 64;
    CK(cudaMallocHost((void **)&b->h_meta, bytes));
    cp_meta_carve(&b->hm_dec, b->h_meta, (int)TM);
    cp_meta_carve(&b->hm_pre, b->h_meta + CP_META_ARRAYS * TM, (int)PM);
    cu_use_meta(b, 0);
    char *q = (char *)(b->h_meta + CP_META_ARRAYS * (TM + PM));
    b->h_sp = (kc_sample_param *)q, q += TM * sizeof(kc_sample_param);
    b->h_bias = (kda_logit_bias *)q, q += TM * KDA_MAX_LOGIT_BIAS * sizeof(kda_logit_bias);
    b->h_tok = (int32_t *)q, q += TM * 4;
    b->h_lp = (float *)q, q += TM * 4;
    b->h_tlp = (float *)q, q += TM * 4;
    b->h_top = (int32_t *)q, q += TM * KDA_MAX_TOP * 4;
    b->h_toplp = (float *)q, q += TM * KDA_MAX_TOP * 4;
    b->h_ptop = (int32_t *)q, q += TM * KDA_MAX_TOP * 4;
    b->h_ptoplp = (float *)q, q += TM * KDA_MAX_TOP * 4;
    b->h_rows = (float *)q;
    b->row_item = (int *)malloc(PM * 2 * sizeof(int));
    b->row_tok = b->row_item ? b->row_item + PM : NULL;
    b->done = (int *)malloc((size_t)b->d.max_seqs * sizeof(int));
    b->split_items = (step_item *)malloc((size_t)b->d.max_seqs * sizeof(step_item));
    if (!b->row_item || !b->done || !b->split_items) {
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    return 0;
}

/* cuBLASLt plans for every decode GEMM shape of each graph bucket above the
 * GEMV's rows (tuning needs real data in the input buffers). A failure keeps
 * plain kc_gemm: a device error then surfaces in the warm-up. */
static void tune_gemms(cuda_backend *b)
{
    const cp_dims *d = &b->d;
    b->glt = kc_gemm_lt_create(CP_CUBLAS_WS, b->cublas_ws, b->tn.gemm_verbose, b->tn.gemm_tune_flush, b->tn.gemm_splitk,
                                b->tn.gemm_skinny);
    if (!b->glt) return;
    const int D = d->D, F = d->F, TM = d->TM;
    int rc = kc_gemm_lt_fill_bf16(b->xn, (size_t)TM * D, 1u, b->st);
    if (!rc) rc = kc_gemm_lt_fill_bf16(b->act, (size_t)TM * F, 2u, b->st);
    if (!rc) rc = kc_gemm_lt_fill_bf16(b->ybuf, (size_t)TM * d->ycols, 3u, b->st);
    /* the weights of every layer of each shape: the skinny GEMM's decision is
     * timed back to back over them (kc_gemm_lt_tune_seq) */
    const uint16_t **wl = (const uint16_t **)calloc((size_t)d->L * 6, sizeof(*wl));
    if (!wl) rc = -1;
    const uint16_t **mix_k = wl, **o_k = wl + d->L, **mix_g = wl + 2 * d->L, **o_g = wl + 3 * d->L,
                   **gu = wl + 4 * d->L, **dn = wl + 5 * d->L;
    int nk = 0, ng = 0, l_k = -1, l_g = -1;
    for (int l = 0; l < d->L && wl; l++) {
        const cu_layer *w = &b->lw[l];
        if (b->c->kind[l] == KDA_LAYER_KDA) {
            if (l_k < 0) l_k = l;
            mix_k[nk] = w->w_mix, o_k[nk++] = w->w_o;
        } else {
            if (l_g < 0) l_g = l;
            mix_g[ng] = w->w_mix, o_g[ng++] = w->w_o;
        }
        gu[l] = w->w_gu, dn[l] = w->w_down;
    }
    for (int Tb = 1; Tb <= TM && !rc; Tb <<= 1) {
        if (Tb <= b->tn.gemv_max_t) continue;
        for (int kda = 1; kda >= 0 && !rc; kda--) {
            const int l = kda ? l_k : l_g, n = kda ? nk : ng;
            if (l < 0) continue;
            const cu_layer *w = &b->lw[l];
            const int ycols = kda ? d->HV : d->Hq * d->hd;
            rc = kc_gemm_lt_tune_seq(b->glt, b->cublas, b->proj, 0, d->ldp, b->xn, D, kda ? mix_k : mix_g, n, Tb,
                                     w->n_mix, D, 0.0f, b->st);
            if (!rc)
                rc = kc_gemm_lt_tune_seq(b->glt, b->cublas, b->h, 0, D, b->ybuf, ycols, kda ? o_k : o_g, n, Tb, D, ycols,
                                         1.0f, b->st);
        }
        const cu_layer *w0 = &b->lw[0];
        if (!rc)
            rc = kc_gemm_lt_tune_seq(b->glt, b->cublas, b->proj, cu_gu_bf16(b, w0), 2 * F, b->xn, D, gu, d->L, Tb, 2 * F,
                                     D, 0.0f, b->st);
        if (!rc) rc = kc_gemm_lt_tune_seq(b->glt, b->cublas, b->h, 0, D, b->act, F, dn, d->L, Tb, D, F, 1.0f, b->st);
        if (!rc)
            rc = kc_gemm_lt_tune(b->glt, b->cublas, b->logits, d->vocab, b->xn, D, b->lm_head, Tb, d->vocab, D, 0.0f,
                                 b->st);
    }
    free(wl);
    kc_gemm_lt_release_scratch(b->glt);
    if (rc) {
        kc_gemm_lt_destroy(b->glt);
        b->glt = NULL;
    }
    cublasSetStream(b->cublas, b->st);
}

/* Every bucket once, outside any capture, all rows padding: kernel attributes
 * and persistent-grid sizes are set here, so graph capture only launches. */
static int warm_up(cuda_backend *b, char *err, size_t errlen)
{
    for (int r = 0; r < b->d.TM; r++) {
        b->hm.tok_ids[r] = -1, b->hm.tok_pos[r] = 0, b->hm.tok_slot[r] = -1;
        b->hm.item_row0[r] = r, b->hm.item_ntok[r] = 1, b->hm.item_slot[r] = -1, b->hm.out_rows[r] = r;
    }
    for (int T = 1; T <= b->d.TM; T <<= 1) {
        int rc = cu_upload_meta(b, err, errlen);
        if (!rc) rc = cu_forward(b, T, T, cu_attn_split(b, T), err, errlen);
        if (!rc) rc = cu_logits(b, 0, T, err, errlen);
        if (rc) return rc;
    }
    cudaError_t e = cudaStreamSynchronize(b->st);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "warm-up failed: %s", cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

static void report(const cuda_backend *b)
{
    const cp_dims *d = &b->d;
    const cp_layout *lo = &b->lo;
    const int full = d->n_gqa ? lo->n_blocks / d->max_blocks : d->max_seqs;
    fprintf(stderr,
            "cuda: %s, pool %zu MiB: weights %zu MiB, KV %zu MiB (%d blocks x %d tokens, %zu KiB/token), "
            "KDA state %zu MiB (%d slots x %.1f MiB), prefix snapshots %zu MiB (%d slots), activations %zu MiB (%d rows); "
            "max concurrent sequences at full context (%d tokens): %d; gemv<=%d rows, graphs %s, pdl %s, "
            "cuBLASLt plans %s, prefill %s (%d rows per pass)\n",
            b->devname, lo->total >> 20, lo->weight_bytes >> 20, lo->kv_bytes >> 20, lo->n_blocks, KV_BLK,
            d->n_gqa ? d->block_elems * 2 / KV_BLK / 1024 : 0, lo->state_bytes >> 20, d->max_seqs,
            d->slot_floats * 4 / 1048576.0, lo->snap_bytes >> 20, d->n_snaps, lo->act_bytes >> 20, d->TM, d->max_seq_len,
            full < d->max_seqs ? full : d->max_seqs, b->tn.gemv_max_t, b->tn.graphs ? "on" : "off",
            b->tn.pdl ? "on" : "off", b->glt ? "on" : "off",
            b->fast_prefill ? "chunked KDA + flash attention" : "per-token kernels", d->PM);
}

int cuda_backend_create(backend **out, const backend_params *p, char *err, size_t errlen)
{
    *out = NULL;
    if (!cuda_device_available()) {
        snprintf(err, errlen, "no CUDA device available");
        return KDA_EUNSUP;
    }
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, errlen, "out of host memory");
        return KDA_ENOMEM;
    }
    const model_config *c = p->cfg;
    b->c = c;
    b->tn = p->tuning;
    int rc = cuda_config_check(c, err, errlen); /* options the kernels do not compute: refused by name */
    if (rc) {
        free(b);
        return rc;
    }
    b->eps = c->norm_eps;
    b->base.destroy = cuda_destroy; /* for the fail path */
    rc = cp_dims_init(&b->d, c, p->w, p->max_seqs, p->max_seq_len, b->tn.prefill_rows, b->tn.kda_state_bf16, err,
                      errlen);
    if (!rc && b->tn.kda_state_bf16 && b->tn.kda_chunk_split > 1) {
        snprintf(err, errlen, "bf16 KDA state (kda_state_bf16) works with the default KDA kernels only, not with "
                 "kda_chunk_split");
        rc = KDA_EUNSUP;
    }
    if (rc) goto fail;
    {
        /* the prefill kernels where they support the shapes (else prompt
         * passes take the decode kernels, as with fast_prefill=0) */
        cp_dims *d = &b->d;
        /* KDA options the chunked kernel does not compute (GVA, the lower-bound
         * gate, beta x 2, conv bias, no conv): prompts through the per-token
         * kernel, which does */
        const char *chunk_lacks = d->n_kda ? cuda_kda_chunk_lacks(c) : NULL;
        const int kda_ok = !d->n_kda || (!chunk_lacks && kc_kda_chunk_supported(d->H, d->K, d->V, d->taps));
        if (b->tn.fast_prefill && chunk_lacks && p->verbose)
            fprintf(stderr, "cuda: the chunked KDA kernel does not compute %s: prompts take the per-token kernels\n",
                    chunk_lacks);
        b->fast_prefill = b->tn.fast_prefill && kda_ok;
        b->kda_preconv = d->n_kda && (c->kda_hv != c->kda_h || c->conv_bias || !c->short_conv);
        if (b->fast_prefill && d->n_kda)
            d->kda_chunk_ws = b->tn.kda_chunk_split > 1
                                  ? kc_kda_chunk_workspace_split(d->PM, d->max_seqs, d->H, d->K, d->V, b->tn.kda_chunk_split)
                                  : kc_kda_chunk_workspace(d->PM, d->max_seqs, d->H, d->K, d->V);
        if (b->fast_prefill && d->n_gqa)
            d->attn_prefill_ws = kc_attn_prefill_workspace(d->PM, d->max_seqs, d->Hq, d->hd, d->max_seq_len);
    }
    b->d.n_snaps = p->max_snaps;
    if (b->d.n_snaps) {
        b->snap_blocks = (int32_t *)calloc((size_t)b->d.n_snaps * b->d.max_blocks + 1, sizeof(int32_t));
        b->snap_nb = (int *)calloc((size_t)b->d.n_snaps, sizeof(int));
        if (!b->snap_blocks || !b->snap_nb) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "out of host memory");
            goto fail;
        }
    }
    b->lw = (cu_layer *)calloc((size_t)c->n_layers, sizeof(cu_layer));
    if (!b->lw) {
        rc = KDA_ENOMEM;
        snprintf(err, errlen, "out of host memory");
        goto fail;
    }
    {
        cudaDeviceProp prop;
        size_t free_b = 0, total_b = 0;
        if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            rc = KDA_EDEVICE;
            snprintf(err, errlen, "cannot query the CUDA device");
            goto fail;
        }
        snprintf(b->devname, sizeof b->devname, "%s", prop.name);
        /* programmatic dependent launch needs sm_90 (measured on the H200,
         * ceb8d11: B=1 1.81 vs 1.85 ms, B=64 3.30 vs 3.39 ms per step) */
        b->tn.pdl = b->tn.pdl && prop.major >= 9;
        kc_set_pdl(b->tn.pdl);
        kc_set_gemv_persist(b->tn.gemv_persist);
        /* KV gets what the fraction of free memory leaves, capped at max_seqs full contexts */
        rc = cp_layout_fit(&b->lo, &b->d, c, (size_t)(p->gpu_mem_fraction * (double)free_b), err, errlen);
        if (rc) goto fail;
    }
    {
        cudaError_t e = cudaMalloc((void **)&b->pool, b->lo.total);
        if (e != cudaSuccess) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "cudaMalloc of the %zu MiB pool failed: %s", b->lo.total >> 20,
                     cudaGetErrorString(e));
            goto fail;
        }
    }
    carve(b);
    if (b->fast_prefill && b->d.n_gqa) { /* the prefill attention takes these shapes and strides? */
        kc_gqa_args a;
        kc_attn_prefill_plan plan;
        memset(&a, 0, sizeof a);
        a.T = b->d.PM, a.Hq = b->d.Hq, a.Hkv = b->d.Hkv, a.hd = b->d.hd, a.kv = b->kv, a.q = b->q;
        a.block_stride = b->d.block_elems, a.layer_off = b->d.kv_layer_elems, a.blk = KV_BLK;
        a.block_table = b->d_table, a.max_blocks = b->d.max_blocks, a.proj = b->proj, a.ldp = b->d.ldp;
        a.off_gate = b->d.gqa_off_g;
        if (kc_attn_prefill_plan_for(&a, b->d.max_seqs, b->d.max_seq_len, b->d.attn_prefill_ws, NULL, &plan)) {
            if (p->verbose) fprintf(stderr, "cuda: prefill attention refuses this shape: prompts take the decode kernels\n");
            b->fast_prefill = 0;
        }
    }
    /* tuning poison bit 14 (tests): the KV cache and the state slots start as NaN, so a
     * kernel reading KV or state that no step wrote shows as NaN in its outputs */
    if (b->tn.poison >> 14 & 1) {
        if (cudaMemset(b->pool + b->lo.kv, 0xFF, b->lo.kv_bytes) != cudaSuccess ||
            cudaMemset(b->pool + b->lo.state, 0xFF, b->lo.state_bytes) != cudaSuccess) {
            rc = KDA_EDEVICE;
            snprintf(err, errlen, "poison: cudaMemset failed");
            goto fail;
        }
    }
    if (kv_alloc_init(&b->ka, b->lo.n_blocks, b->d.max_seqs, b->d.max_blocks)) {
        rc = KDA_ENOMEM;
        snprintf(err, errlen, "out of host memory");
        goto fail;
    }
    if ((rc = host_buffers(b, err, errlen))) goto fail;
    if (cudaDeviceGetStreamPriorityRange(&b->prio_lo, &b->prio_hi) != cudaSuccess ||
        cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess ||
        cudaStreamCreateWithPriority(&b->st, cudaStreamNonBlocking, b->prio_hi) != cudaSuccess ||
        cudaStreamCreateWithPriority(&b->st2, cudaStreamNonBlocking, b->prio_lo) != cudaSuccess ||
        cudaEventCreateWithFlags(&b->ev_fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&b->ev_join, cudaEventDisableTiming) != cudaSuccess ||
        cublasCreate(&b->cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(b->cublas, b->cublas_ws, CP_CUBLAS_WS) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(b->cublas, b->st) != CUBLAS_STATUS_SUCCESS) {
        rc = KDA_EDEVICE;
        snprintf(err, errlen, "CUDA stream / cuBLAS setup failed");
        goto fail;
    }
    cublasSetMathMode(b->cublas, CUBLAS_DEFAULT_MATH);
    if ((rc = cu_upload_weights(b, p->w, err, errlen))) goto fail;
    if (cudaMemset(b->state, 0, b->lo.state_bytes) != cudaSuccess ||
        cudaMemset(b->d_table, 0, (size_t)b->d.max_seqs * b->d.max_blocks * 4) != cudaSuccess) {
        rc = KDA_EDEVICE;
        snprintf(err, errlen, "cudaMemset failed");
        goto fail;
    }
    if (b->tn.gemm_lt) tune_gemms(b);
    if (b->fast_prefill && b->tn.gemm_pad) {
        struct timespec t0, t1;
        int n_shapes = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (cu_prepare_prompt_gemms(b, &n_shapes)) {
            rc = KDA_EDEVICE;
            snprintf(err, errlen, "preparing the prompt-pass GEMMs failed: %s", cudaGetErrorString(cudaGetLastError()));
            goto fail;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (p->verbose)
            fprintf(stderr, "cuda: prompt-pass GEMMs prepared at %d row counts in %.0f ms\n", n_shapes,
                    (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
    }
    if (b->tn.prof) { /* events cannot be timed inside graphs: profiled runs are eager */
        b->tn.graphs = 0;
        b->prof_ev = (cudaEvent_t *)calloc(CU_PROF_MAX, sizeof(cudaEvent_t));
        b->prof_kind = (unsigned char *)calloc(CU_PROF_MAX, 1);
        if (!b->prof_ev || !b->prof_kind) {
            rc = KDA_ENOMEM;
            snprintf(err, errlen, "out of host memory");
            goto fail;
        }
        for (int i = 0; i < CU_PROF_MAX; i++)
            if (cudaEventCreate(&b->prof_ev[i]) != cudaSuccess) {
                rc = KDA_EDEVICE;
                snprintf(err, errlen, "cudaEventCreate failed");
                goto fail;
            }
        b->base.prof_take = cuda_prof_take;
    }
    if ((rc = warm_up(b, err, errlen))) goto fail;

    b->base.seq_reset = cuda_seq_reset;
    b->base.seq_release = cuda_seq_release;
    b->base.seq_reserve = cuda_seq_reserve;
    b->base.step = cu_step;
    b->base.step_begin = cu_step_begin;
    b->base.step_end = cu_step_end;
    b->base.kv_bytes_used = cuda_kv_bytes_used;
    if (b->d.n_snaps) {
        b->base.n_snaps = b->d.n_snaps;
        b->base.snap_state_bytes = b->d.slot_floats * sizeof(float);
        b->base.snap_take = cuda_snap_take;
        b->base.snap_restore = cuda_snap_restore;
        b->base.snap_drop = cuda_snap_drop;
        b->base.cache_bytes = cuda_cache_bytes;
    }
    b->base.pool_bytes = b->lo.total;
    b->base.kv_pool_bytes = b->lo.kv_bytes;
    b->base.state_pool_bytes = b->lo.state_bytes;
    b->base.kv_bytes_per_token = b->d.n_gqa ? b->d.block_elems * 2 / KV_BLK : 0;
    {
        const int full = b->d.n_gqa ? b->lo.n_blocks / b->d.max_blocks : b->d.max_seqs;
        b->base.max_full_context_seqs = full < b->d.max_seqs ? full : b->d.max_seqs;
    }
    b->base.device_name = b->devname;
    b->base.pass_rows = b->fast_prefill ? b->d.PM : b->d.TM;
    if (p->verbose) report(b);
    b->prof_on = b->tn.prof; /* after the warm-up: only steps are profiled */
    *out = &b->base;
    return 0;
fail:
    cuda_destroy(&b->base);
    return rc ? rc : KDA_EDEVICE;
}
