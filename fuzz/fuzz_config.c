/*
 * fuzz_config.c - config.json parsing (engine/config.c, config maps in
 * config_map.c) and how a config and a safetensors header are bound together
 * (engine/weights.c).
 *
 * Input: one flags byte, the config.json text, a NUL byte, then the JSON
 * header of a safetensors file. The harness writes the file around that
 * header itself (8-byte length, header padded to 8 bytes as writers do, and a
 * data section as long as the largest data_offsets end, up to 1 MiB), so the
 * fuzzer mutates JSON only and still reaches the binding.
 *   flags bits 0-1: config map  0 none, 1 the configs/ folder,
 *                               2 configs/bqalm.configmap.json, 3 none
 *   flags bit 2:    name map configs/hf.map (else the built-in detection)
 * Checks: a parsed config is within the engine's limits (model.h); a bound
 * model's every view lies inside the file (its first and last rows are read,
 * so ASan sees an out-of-range view); a rejected one says why.
 */
#include "fuzz_common.h"

#include <cjson/cJSON.h>
#include <math.h>

#include "model.h"
#include "safetensors.h"

#define FUZZ_MAX_DATA (1u << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    return 0;
}

/* The data section the header asks for: the largest data_offsets end. */
static size_t data_size_of(const char *header)
{
    cJSON *root = cJSON_Parse(header);
    double end = 0;
    if (cJSON_IsObject(root))
        for (const cJSON *e = root->child; e; e = e->next) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
            const cJSON *hi = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, 1) : NULL;
            if (cJSON_IsNumber(hi) && hi->valuedouble > end) end = hi->valuedouble;
        }
    cJSON_Delete(root);
    return end <= FUZZ_MAX_DATA ? (size_t)end : 0;
}

static volatile float sink;

/* Reads rows 0 and rows-1 of a bound view through the engine's own accessor. */
static void touch(const tensor_view *v, const char *what, int layer)
{
    if (!v->data) return;
    FZ_CHECK(v->rows > 0 && v->cols > 0 && v->group_rows > 0, "layer %d %s: view %lldx%lld", layer, what,
             (long long)v->rows, (long long)v->cols);
    FZ_CHECK((size_t)v->cols <= FUZZ_MAX_DATA, "layer %d %s: %lld cols in a 1 MiB file", layer, what,
             (long long)v->cols);
    float *row = malloc((size_t)v->cols * sizeof *row);
    if (!row) abort();
    tv_row_f32(v, 0, row);
    tv_row_f32(v, v->rows - 1, row);
    sink += row[0] + row[v->cols - 1];
    free(row);
}

static void touch_all(const model_weights *w, const model_config *c)
{
    touch(&w->embed, "embed", -1);
    touch(&w->final_norm, "final_norm", -1);
    touch(&w->lm_head, "lm_head", -1);
    touch(&w->res.query, "res.query", -1);
    touch(&w->res.norm, "res.norm", -1);
    FZ_CHECK(w->embed.rows == c->vocab && w->embed.cols == c->d, "embed %lldx%lld for vocab %d, d %d",
             (long long)w->embed.rows, (long long)w->embed.cols, c->vocab, c->d);
    for (int i = 0; i < c->n_layers; i++) {
        const layer_weights *L = &w->layers[i];
#define T(f) touch(&L->f, #f, i)
        T(attn_norm); T(mlp_norm);
        T(mlp.gate); T(mlp.up); T(mlp.down); T(mlp.gate_bias); T(mlp.up_bias); T(mlp.down_bias);
        T(attn_res.query); T(attn_res.norm); T(mlp_res.query); T(mlp_res.norm);
        if (L->kind == KDA_LAYER_KDA) {
            T(kda.q); T(kda.k); T(kda.v); T(kda.q_conv); T(kda.k_conv); T(kda.v_conv);
            T(kda.q_conv_bias); T(kda.k_conv_bias); T(kda.v_conv_bias); T(kda.f0); T(kda.f1); T(kda.b);
            T(kda.A_log); T(kda.dt_bias); T(kda.g0); T(kda.g1); T(kda.g1_bias); T(kda.o_norm); T(kda.o);
        } else {
            T(gqa.q); T(gqa.gate); T(gqa.k); T(gqa.v); T(gqa.o); T(gqa.q_norm); T(gqa.k_norm);
            T(gqa.q_bias); T(gqa.k_bias); T(gqa.v_bias); T(gqa.o_bias);
        }
#undef T
    }
}

/* What the rest of the engine relies on once config_parse said yes. */
static void check_config(const model_config *c)
{
    FZ_CHECK(c->n_layers > 0 && c->n_layers <= KDA_MAX_LAYERS, "n_layers %d", c->n_layers);
    FZ_CHECK(c->d > 0 && c->vocab > 0, "d %d vocab %d", c->d, c->vocab);
    FZ_CHECK(c->bos_id >= -1 && c->bos_id < c->vocab, "bos_id %d, vocab %d", c->bos_id, c->vocab);
    FZ_CHECK(c->eos_id >= -1 && c->eos_id < c->vocab, "eos_id %d, vocab %d", c->eos_id, c->vocab);
    FZ_CHECK(isfinite(c->norm_eps), "norm_eps %g", c->norm_eps);
    for (int i = 0; i < c->n_layers; i++)
        FZ_CHECK(c->kind[i] == KDA_LAYER_KDA || c->kind[i] == KDA_LAYER_GQA, "layer %d kind %d", i, (int)c->kind[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader r = {data, size};
    unsigned flags = fz_byte(&r);
    const uint8_t *cp, *hp;
    size_t cn = fz_until(&r, 0, &cp);
    size_t hn = r.n;
    hp = r.p;
    char *config = fz_strndup(cp, cn);
    static const char *const maps[4] = {NULL, FUZZ_SRC_ROOT "/configs", FUZZ_SRC_ROOT "/configs/bqalm.configmap.json",
                                        NULL};
    const char *map = maps[flags & 3];
    const char *names = flags & 4 ? FUZZ_SRC_ROOT "/configs/hf.map" : NULL;

    model_config *c = malloc(sizeof *c);   /* large (rope table): not on the stack */
    if (!c) abort();
    char err[1024] = "";
    int rc = config_parse_mapped(c, config, map, err, sizeof err);
    free(config);
    if (rc) {
        FZ_CHECK(err[0], "config rejected (%d) without a message", rc);
        free(c);
        return 0;
    }
    check_config(c);

    /* The file: u64 length, header padded with spaces to 8 bytes, data. */
    char *header = fz_strndup(hp, hn);
    size_t padded = (hn + 7) / 8 * 8, dsize = data_size_of(header);
    size_t fsize = 8 + padded + dsize;
    unsigned char *file = malloc(fsize);
    if (!file) abort();
    for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(file + 8, hp, hn);
    memset(file + 8 + hn, ' ', padded - hn);
    for (size_t i = 0; i < dsize; i++) file[8 + padded + i] = (unsigned char)(0x3c + i % 7);   /* small finite values */
    free(header);

    st_set *st = calloc(1, sizeof *st);
    if (!st) abort();
    err[0] = 0;
    if (st_parse(st, 0, file, fsize, "model.safetensors", err, sizeof err) == 0) {
        model_weights w;
        err[0] = 0;
        rc = weights_bind(&w, c, st, names, err, sizeof err);
        if (rc == 0) {
            touch_all(&w, c);
            FZ_CHECK(w.bytes <= dsize, "bound %zu bytes of a %zu-byte data section", w.bytes, dsize);
            weights_free(&w);
        } else {
            FZ_CHECK(err[0], "binding failed (%d) without a message", rc);
            FZ_CHECK(w.layers == NULL, "failed binding kept its layers");
        }
    }
    st_close(st);
    free(file);
    free(c);
    return 0;
}
