/*
 * cuda_step.cu - one engine step on the GPU. The engine has validated the
 * items and reserved their KV blocks (engine.c), so nothing here can fail but
 * the device. A decode step (every item one token) is packed into one pass
 * and replays the CUDA graph of its batch bucket; prompt chunks run eagerly in
 * passes of at most PM rows (cuda_plan.c packs both), with a step's decoding
 * sequences in the first pass (tuning mixed_pass) or in their own graph. After each pass the
 * requested outputs of its rows are computed on the device and copied back:
 * sampled tokens with their log-probs and top-n (kc_sample, penalties over the
 * device-side token history, logit_bias), per-position top-n (the same
 * kernel, greedy, for rows that only want their alternatives), target
 * log-probs, and when asked for, whole logits rows (through a pinned host
 * buffer, CU_HOST_ROWS rows at a time).
 */
#include "cuda_internal.h"

void cu_use_meta(cuda_backend *b, int prefill)
{
    b->meta_pre = prefill;
    b->dm = prefill ? b->dm_pre : b->dm_dec;
    b->hm = prefill ? b->hm_pre : b->hm_dec;
}

int cu_upload_meta(cuda_backend *b, char *err, size_t errlen)
{
    const size_t off = b->meta_pre ? (size_t)CP_META_ARRAYS * b->d.TM : 0;
    const size_t n = (size_t)CP_META_ARRAYS * (b->meta_pre ? b->d.PM : b->d.TM);
    CK(cudaMemcpyAsync(b->d_meta + off, b->h_meta + off, n * sizeof(int32_t), cudaMemcpyHostToDevice, b->st));
    return 0;
}

/* T rows of metadata are in b->hm. decode: replay (capturing it the first
 * time) the graph of bucket bi, whose rows and output rows are T. */
static int run_decode(cuda_backend *b, int T, int bi, char *err, size_t errlen)
{
    int rc = cu_upload_meta(b, err, errlen);
    if (rc) return rc;
    const int split = cu_attn_split(b, T);
    if (!b->tn.graphs) {
        rc = cu_forward(b, T, T, split, err, errlen);
        return rc ? rc : cu_logits(b, 0, T, err, errlen);
    }
    if (!b->graph[bi]) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(b->st, cudaStreamCaptureModeThreadLocal));
        rc = cu_forward(b, T, T, split, err, errlen);
        if (!rc) rc = cu_logits(b, 0, T, err, errlen);
        cudaError_t e = cudaStreamEndCapture(b->st, &g);
        if (rc) return rc;
        if (e != cudaSuccess) {
            snprintf(err, errlen, "graph capture failed: %s", cudaGetErrorString(e));
            return KDA_EDEVICE;
        }
        CK(cudaGraphInstantiate(&b->graph[bi], g, 0));
        cudaGraphDestroy(g);
    }
    CK(cudaGraphLaunch(b->graph[bi], b->st));
    return 0;
}

static int penalised(const kda_sampling *sp)
{
    return (sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0.0f) || sp->presence_penalty != 0.0f ||
           sp->frequency_penalty != 0.0f;
}

/* Whole logits rows of the pass's output rows, through the pinned buffer. */
static int logits_to_host(cuda_backend *b, const step_item *items, const int *row_item, const int *row_tok, int n_out,
                          char *err, size_t errlen)
{
    const int vocab = b->d.vocab;
    for (int r0 = 0; r0 < n_out; r0 += CU_HOST_ROWS) {
        const int nr = n_out - r0 < CU_HOST_ROWS ? n_out - r0 : CU_HOST_ROWS;
        int any = 0;
        for (int r = r0; r < r0 + nr; r++) {
            const kda_batch_item *it = items[row_item[r]].it;
            any |= it->logits && (it->want_all_logits || row_tok[r] == it->n_tokens - 1);
        }
        if (!any) continue;
        CK(cudaMemcpyAsync(b->h_rows, b->logits + (size_t)r0 * vocab, (size_t)nr * vocab * 4, cudaMemcpyDeviceToHost,
                           b->st));
        CK(cudaStreamSynchronize(b->st));
        for (int r = r0; r < r0 + nr; r++) {
            const kda_batch_item *it = items[row_item[r]].it;
            const int t = row_tok[r];
            if (it->logits && (it->want_all_logits || t == it->n_tokens - 1))
                memcpy(it->logits + (it->want_all_logits ? (size_t)t * vocab : 0), b->h_rows + (size_t)(r - r0) * vocab,
                       (size_t)vocab * 4);
        }
    }
    return 0;
}

/* After the logits of out rows [0, n_out) (row_item / row_tok say whose) are
 * in b->logits: compute what their items asked for and enqueue the copies
 * back (emit_collect reads them once the stream is idle; until then nothing
 * else may use the output buffers). With the
 * prefill kernels one fused pass per row gives lse, target log-probs and the
 * per-position top-n (kc_logprob_rows); otherwise kc_row_lse + gather, and
 * per-position top-n through kc_sample's (greedy) top-n. */
static int emit_enqueue(cuda_backend *b, const step_item *items, const int *row_item, const int *row_tok, int n_out,
                        char *err, size_t errlen)
{
    const int vocab = b->d.vocab, cap = b->d.max_seq_len, fused = b->fast_prefill;
    int need_lse = 0, n_lp = 0, n_sp = 0, n_bias = 0, any_top = 0, ptop = 0;
    for (int r = 0; r < n_out; r++) {
        const step_item *si = &items[row_item[r]];
        const kda_batch_item *it = si->it;
        if (fused) b->hm.lp_targets[r] = -1;
        if (it->targets && it->target_logprobs) {
            if (fused) {
                b->hm.lp_targets[r] = it->targets[row_tok[r]];
            } else {
                b->hm.lp_rows[n_lp] = r;
                b->hm.lp_targets[n_lp] = it->targets[row_tok[r]];
            }
            n_lp++;
            need_lse = 1;
        }
        const int samples = row_tok[r] == it->n_tokens - 1 && it->sampling;
        const int pos_top = it->n_top > 0 && it->pos_top_ids && it->pos_top_logprobs;
        if (pos_top && fused) {
            ptop = it->n_top > ptop ? it->n_top : ptop;
            need_lse = 1;
        } else if (!samples && pos_top) { /* alternatives only: a greedy draw whose token is ignored */
            kc_sample_param *p = &b->h_sp[n_sp++];
            memset(p, 0, sizeof *p);
            p->row = r;
            p->top_p = 1.0f;
            p->rep = 1.0f;
            p->n_top = it->n_top;
            any_top = need_lse = 1;
        }
        if (samples) {
            const kda_sampling *sp = it->sampling;
            const int n_hist = si->pos + it->n_tokens;
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
            p->counter = (uint64_t)(n_hist - sp->n_prompt);
            p->n_top = it->n_top;
            any_top |= it->n_top > 0;
            if (penalised(sp)) { /* the slot's history is on the device already */
                p->hist_off = si->slot * cap;
                p->n_prompt = sp->n_prompt;
                p->n_gen = n_hist - sp->n_prompt;
            }
            p->bias_off = n_bias;
            p->n_bias = sp->n_logit_bias;
            if (sp->n_logit_bias) memcpy(b->h_bias + n_bias, sp->logit_bias, (size_t)sp->n_logit_bias * sizeof *b->h_bias);
            n_bias += sp->n_logit_bias;
            need_lse = 1;
        }
    }
    cudaStream_t s = b->st;
    if (fused && need_lse) {
        if (n_lp) CK(cudaMemcpyAsync(b->dm.lp_targets, b->hm.lp_targets, (size_t)n_out * 4, cudaMemcpyHostToDevice, s));
        KC_CHECK(kc_logprob_rows(b->logits, vocab, n_out, vocab, n_lp ? b->dm.lp_targets : NULL, b->lse, b->tlp, ptop,
                                 b->d_ptop, b->d_ptoplp, KDA_MAX_TOP, s));
        if (n_lp) CK(cudaMemcpyAsync(b->h_tlp, b->tlp, (size_t)n_out * 4, cudaMemcpyDeviceToHost, s));
        if (ptop) {
            CK(cudaMemcpyAsync(b->h_ptop, b->d_ptop, (size_t)n_out * KDA_MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaMemcpyAsync(b->h_ptoplp, b->d_ptoplp, (size_t)n_out * KDA_MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
        }
    } else if (need_lse) {
        KC_CHECK(kc_row_lse(b->lse, b->logits, n_out, vocab, s));
    }
    if (n_lp && !fused) {
        CK(cudaMemcpyAsync(b->dm.lp_rows, b->hm.lp_rows, (size_t)n_lp * 4, cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(b->dm.lp_targets, b->hm.lp_targets, (size_t)n_lp * 4, cudaMemcpyHostToDevice, s));
        KC_CHECK(kc_gather_logprob(b->tlp, b->logits, b->lse, b->dm.lp_rows, b->dm.lp_targets, n_lp, vocab, s));
        CK(cudaMemcpyAsync(b->h_tlp, b->tlp, (size_t)n_lp * 4, cudaMemcpyDeviceToHost, s));
    }
    if (n_sp) {
        CK(cudaMemcpyAsync(b->d_sp, b->h_sp, (size_t)n_sp * sizeof(kc_sample_param), cudaMemcpyHostToDevice, s));
        if (n_bias) CK(cudaMemcpyAsync(b->d_bias, b->h_bias, (size_t)n_bias * sizeof *b->h_bias, cudaMemcpyHostToDevice, s));
        KC_CHECK(kc_sample(b->d_sp, n_sp, b->logits, vocab, b->lse, b->d_hist, (const kc_logit_bias *)b->d_bias,
                           b->d_scratch, b->d_tok, b->d_lp, b->d_top, b->d_toplp, KDA_MAX_TOP, s));
        CK(cudaMemcpyAsync(b->h_tok, b->d_tok, (size_t)n_sp * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(b->h_lp, b->d_lp, (size_t)n_sp * 4, cudaMemcpyDeviceToHost, s));
        if (any_top) {
            CK(cudaMemcpyAsync(b->h_top, b->d_top, (size_t)n_sp * KDA_MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaMemcpyAsync(b->h_toplp, b->d_toplp, (size_t)n_sp * KDA_MAX_TOP * 4, cudaMemcpyDeviceToHost, s));
        }
    }
    PROF(b, KDA_PROF_LMHEAD);
    b->pend = {items, row_item, row_tok, n_out, 1};
    return logits_to_host(b, items, row_item, row_tok, n_out, err, errlen);
}

/* The outputs emit_enqueue left, into their items (the stream is idle). */
static void emit_collect(cuda_backend *b)
{
    if (!b->pend.active) return;
    b->pend.active = 0;
    const step_item *items = b->pend.items;
    const int *row_item = b->pend.row_item, *row_tok = b->pend.row_tok, n_out = b->pend.n_out;
    const int fused = b->fast_prefill;
    int ilp = 0, isp = 0;
    for (int r = 0; r < n_out; r++) {
        const kda_batch_item *it = items[row_item[r]].it;
        const int t = row_tok[r];
        if (it->targets && it->target_logprobs) it->target_logprobs[t] = b->h_tlp[fused ? r : ilp++];
        const int samples = t == it->n_tokens - 1 && it->sampling;
        const int pos_top = it->n_top > 0 && it->pos_top_ids && it->pos_top_logprobs;
        if (pos_top && fused) {
            memcpy(it->pos_top_ids + (size_t)t * it->n_top, b->h_ptop + (size_t)r * KDA_MAX_TOP, (size_t)it->n_top * 4);
            memcpy(it->pos_top_logprobs + (size_t)t * it->n_top, b->h_ptoplp + (size_t)r * KDA_MAX_TOP,
                   (size_t)it->n_top * 4);
        }
        if (!samples && (!pos_top || fused)) continue;
        const int32_t *ids = b->h_top + (size_t)isp * KDA_MAX_TOP;
        const float *lps = b->h_toplp + (size_t)isp * KDA_MAX_TOP;
        if (samples) {
            if (it->sampled) *it->sampled = b->h_tok[isp];
            if (it->sampled_logprob) *it->sampled_logprob = b->h_lp[isp];
            if (it->n_top > 0 && it->top_ids && it->top_logprobs) {
                memcpy(it->top_ids, ids, (size_t)it->n_top * 4);
                memcpy(it->top_logprobs, lps, (size_t)it->n_top * 4);
            }
        }
        if (pos_top && !fused) {
            memcpy(it->pos_top_ids + (size_t)t * it->n_top, ids, (size_t)it->n_top * 4);
            memcpy(it->pos_top_logprobs + (size_t)t * it->n_top, lps, (size_t)it->n_top * 4);
        }
        isp++;
    }
}

static int emit_outputs(cuda_backend *b, const step_item *items, const int *row_item, const int *row_tok, int n_out,
                        char *err, size_t errlen)
{
    int rc = emit_enqueue(b, items, row_item, row_tok, n_out, err, errlen);
    if (rc) return rc;
    CK(cudaStreamSynchronize(b->st));
    emit_collect(b);
    return 0;
}

static int step(cuda_backend *b, const step_item *items, int n, char *err, size_t errlen);

/* tuning poison (tests): the step's scratch buffers whose bit is set filled
 * with 0xFF bytes (NaN in fp32 and bf16) before the step, so that a kernel
 * reading what this step did not write shows as NaN in its outputs */
static int poison(cuda_backend *b)
{
    const cp_layout *lo = &b->lo;
    const size_t at[] = {lo->h, lo->proj, lo->q, lo->lowrank, lo->lowin, lo->kda_ws, lo->attn_ws, lo->opart, lo->ml,
                         lo->logits, lo->xn, lo->act, lo->ybuf, lo->lowrank_dec};
    /* every region of the activation area: one ends where the next in carve order starts */
    const size_t bound[] = {lo->h, lo->proj, lo->q, lo->lowrank, lo->lowin, lo->kda_ws, lo->attn_ws, lo->opart,
                            lo->ml, lo->logits, lo->lse, lo->tlp, lo->xn, lo->act, lo->ybuf, lo->meta,
                            lo->sample_params, lo->hist, lo->scratch, lo->tok, lo->lp, lo->top, lo->toplp, lo->ptop,
                            lo->ptoplp, lo->bias, lo->table, lo->cublas_ws, lo->lowrank_dec, lo->act_end};
    const size_t n = sizeof at / sizeof at[0];
    for (size_t i = 0; i < n; i++) {
        if (!(b->tn.poison >> i & 1)) continue;
        size_t end = lo->act_end;
        for (size_t j = 0; j < sizeof bound / sizeof bound[0]; j++)
            if (bound[j] > at[i] && bound[j] < end) end = bound[j];
        if (cudaMemsetAsync(b->pool + at[i], 0xFF, end - at[i], b->st) != cudaSuccess) return -7;
    }
    return 0;
}

int cu_step_begin(backend *bb, const step_item *items, int n, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    b->pend.active = 0;
    if (b->tn.poison && poison(b)) {
        snprintf(err, errlen, "poison: cudaMemsetAsync failed");
        return KDA_EDEVICE;
    }
    const int rc = step(b, items, n, err, errlen);
    if (rc) b->pend.active = 0;
    return rc;
}

int cu_step_end(backend *bb, char *err, size_t errlen)
{
    cuda_backend *b = (cuda_backend *)bb;
    CK(cudaStreamSynchronize(b->st));
    emit_collect(b);
    if (b->prof_on) {
        cu_prof_fold(b);
        b->prof_steps++;
    }
    return 0;
}

int cu_step(backend *bb, const step_item *items, int n, char *err, size_t errlen)
{
    const int rc = cu_step_begin(bb, items, n, err, errlen);
    return rc ? rc : cu_step_end(bb, err, errlen);
}

/* A pass of a few short prompts alone (tuning short_prompt: every item at
 * most that many tokens, at most 4x that many rows, no decode rows) runs
 * through the per-token kernels, which beat the chunked ones there. */
static int short_pass(const cuda_backend *b, int T, int ni, int n_dec)
{
    const int sp = b->tn.short_prompt;
    if (n_dec || T > 4 * sp || T > b->d.TM) return 0;
    for (int k = 0; k < ni; k++)
        if (b->hm.item_ntok[k] > sp) return 0;
    return 1;
}

static int step(cuda_backend *b, const step_item *items, int n, char *err, size_t errlen)
{
    const cp_dims *d = &b->d;
    int decode = n <= d->TM, n1 = 0;
    for (int i = 0; i < n; i++) n1 += items[i].it->n_tokens == 1;
    decode = decode && n1 == n;
    int n_dec = 0; /* one-token items at the head of the first pass, through the decode kernels */
    if (!decode && n1 && b->fast_prefill) {
        /* decoding sequences and prompt chunks in one step, the one-token
         * items first. mixed_pass: one pass over all rows, the one-token
         * items through the decode KDA and attention kernels, so the weights
         * are read once; otherwise the one-token items replay their decode
         * graph and the chunks take a prompt pass (through the prompt
         * kernels, 256 one-token items made a step 3x slower on the H200) */
        step_item *one = b->split_items, *many = b->split_items + n1;
        int a = 0, c = 0;
        for (int i = 0; i < n; i++) (items[i].it->n_tokens == 1 ? one[a++] : many[c++]) = items[i];
        if (!b->tn.mixed_pass || n1 > d->TM) {
            int rc = step(b, one, a, err, errlen);
            if (rc) return rc;
            CK(cudaStreamSynchronize(b->st)); /* the first half's outputs before the second reuses the buffers */
            emit_collect(b);
            return step(b, many, c, err, errlen);
        }
        items = b->split_items;
        n_dec = n1;
    }
    int *row_item = b->row_item, *row_tok = b->row_tok, rc = 0;
    cu_use_meta(b, !decode);
    if (decode) {
        int bi = 0;
        const int Tb = cp_pack_decode(&b->hm, items, n, b->tn.graphs, &bi);
        for (int r = 0; r < n; r++) row_item[r] = r, row_tok[r] = 0; /* logits row r = item r */
        rc = run_decode(b, Tb, bi, err, errlen);
        return rc ? rc : emit_enqueue(b, items, row_item, row_tok, n, err, errlen);
    }
    /* prompt chunks (and any decode rows with them): passes of at most PM rows
     * (TM with the decode kernels), outputs in blocks of TM rows */
    const int rows = b->fast_prefill ? d->PM : d->TM;
    memset(b->done, 0, (size_t)n * sizeof *b->done);
    for (;;) {
        int ni = 0, no = 0, ctx = 0;
        const int T = cp_pack_pass(&b->hm, items, n, b->done, rows, &ni, &no, &ctx, row_item, row_tok);
        if (T == 0) break;
        int more = 0; /* another pass follows */
        for (int i = 0; i < n && !more; i++) more = b->done[i] < items[i].it->n_tokens;
        if ((rc = cu_upload_meta(b, err, errlen))) return rc;
        /* the first pass packs the n_dec one-token items first (n_dec <= TM <= PM) */
        rc = b->fast_prefill && !short_pass(b, T, ni, n_dec) ? cu_forward_prefill(b, T, ni, n_dec, ctx, err, errlen)
                             : cu_forward(b, T, ni, cu_attn_split(b, T), err, errlen);
        n_dec = 0;
        for (int k0 = 0; !rc && k0 < no; k0 += d->TM) {
            const int nb = no - k0 < d->TM ? no - k0 : d->TM;
            rc = cu_logits(b, k0, nb, err, errlen);
            /* the step's last outputs are read back by cu_step_end */
            if (!rc) rc = more || k0 + nb < no ? emit_outputs(b, items, row_item + k0, row_tok + k0, nb, err, errlen)
                                               : emit_enqueue(b, items, row_item + k0, row_tok + k0, nb, err, errlen);
        }
        if (rc || !more) return rc;
        /* the next pass packs into the same pinned metadata the upload above
         * reads asynchronously: wait for this pass first (emit_outputs did
         * when there were outputs) */
        if (!no) CK(cudaStreamSynchronize(b->st));
    }
    return 0;
}
