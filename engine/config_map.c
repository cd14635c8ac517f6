/*
 * config_map.c - config maps: a small JSON file (configs/README.md) that
 * rewrites a foreign config.json's keys and values into one of the engine's
 * two families, so a new layout needs a file, not C.
 *
 *     {"model_type": "bqalm", "engine_model_type": "kda",
 *      "keys": {"d_model": "hidden_size",
 *               "mixer_types": {"to": "attn.layers", "indices_of": "attention"},
 *               "act": {"to": "hidden_act", "values": {"silu": "swish"}},
 *               "dropout": null},
 *      "set": {"attn.qk_norm": true}}
 *
 * "keys" moves each listed key (a dotted path reads or writes inside objects)
 * to its target, translating values through "values" or turning a list of
 * layer kinds into the indices of one kind; null drops a key the map's author
 * states has no effect on inference. Keys the map does not list pass through
 * unchanged, so the engine's strict parser still names anything it does not
 * know. "set" adds constants. Writing a key twice is an error.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kda_file.h"
#include "model.h"

#define MAP_FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); rc = KDA_EFORMAT; goto out; } while (0)

static char *read_small_file(const char *path, char *err, size_t errlen)
{
    char why[512];
    char *buf = kda_file_read(path, KDA_MAX_MAP_BYTES, NULL, why, sizeof why);
    if (!buf) snprintf(err, errlen, "config map %s", why);
    return buf;
}

/* The map's own shape: every top-level key known, the types right. */
static int map_validate(const cJSON *m, const char *path, char *err, size_t errlen)
{
    static const char *const known[] = {"model_type", "engine_model_type", "keys", "set", "comment", NULL};
    if (!cJSON_IsObject(m)) {
        snprintf(err, errlen, "config map %s: top level must be an object", path);
        return KDA_EFORMAT;
    }
    for (const cJSON *it = m->child; it; it = it->next) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= !strcmp(it->string, known[i]);
        if (!ok) {
            snprintf(err, errlen, "config map %s: unknown key \"%s\"", path, it->string);
            return KDA_EFORMAT;
        }
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(m, "model_type");
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(m, "engine_model_type");
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(m, "keys");
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(m, "set");
    if (!cJSON_IsString(mt)) {
        snprintf(err, errlen, "config map %s: \"model_type\" (the config.json it applies to) must be a string", path);
        return KDA_EFORMAT;
    }
    if (!cJSON_IsString(et) || (strcmp(et->valuestring, "kda") && strcmp(et->valuestring, "llama_kda"))) {
        snprintf(err, errlen, "config map %s: \"engine_model_type\" must be \"kda\" or \"llama_kda\"", path);
        return KDA_EFORMAT;
    }
    if ((keys && !cJSON_IsObject(keys)) || (set && !cJSON_IsObject(set))) {
        snprintf(err, errlen, "config map %s: \"keys\" and \"set\" must be objects", path);
        return KDA_EFORMAT;
    }
    for (const cJSON *k = keys ? keys->child : NULL; k; k = k->next) {
        if (cJSON_IsNull(k) || cJSON_IsString(k)) continue;
        const cJSON *to = cJSON_GetObjectItemCaseSensitive(k, "to");
        const cJSON *vals = cJSON_GetObjectItemCaseSensitive(k, "values");
        const cJSON *idx = cJSON_GetObjectItemCaseSensitive(k, "indices_of");
        int n = 0;
        for (const cJSON *f = cJSON_IsObject(k) ? k->child : NULL; f; f = f->next) n++;
        if (!cJSON_IsObject(k) || !cJSON_IsString(to) || (vals && !cJSON_IsObject(vals)) || (vals && idx) ||
            n != 1 + !!vals + !!idx) {
            snprintf(err, errlen, "config map %s: \"keys.%s\" must be a target name, null, or {\"to\": NAME} with "
                     "one of \"values\" {...} or \"indices_of\" VALUE", path, k->string);
            return KDA_EFORMAT;
        }
    }
    return 0;
}

/* The object that holds the last component of a dotted path, and that
 * component; creates missing objects when create. NULL if a non-object is in
 * the way (or missing and !create). */
static cJSON *path_parent(cJSON *root, const char *path, int create, char *leaf, size_t leafn)
{
    cJSON *o = root;
    const char *p = path;
    for (const char *dot; (dot = strchr(p, '.')); p = dot + 1) {
        char part[256];
        size_t n = (size_t)(dot - p);
        if (n == 0 || n >= sizeof part) return NULL;
        memcpy(part, p, n);
        part[n] = 0;
        cJSON *next = cJSON_GetObjectItemCaseSensitive(o, part);
        if (!next && create) {
            next = cJSON_CreateObject();
            if (!next) return NULL;
            cJSON_AddItemToObject(o, part, next);
        }
        if (!cJSON_IsObject(next)) return NULL;
        o = next;
    }
    if (!*p || strlen(p) >= leafn) return NULL;
    snprintf(leaf, leafn, "%s", p);
    return o;
}

/* Detaches the item at a dotted path (NULL if absent), then removes objects
 * on the path that it left empty. */
static cJSON *path_detach(cJSON *root, const char *path)
{
    char leaf[256];
    cJSON *parent = path_parent(root, path, 0, leaf, sizeof leaf);
    if (!parent) return NULL;
    cJSON *v = cJSON_DetachItemFromObjectCaseSensitive(parent, leaf);
    if (v && parent != root && !parent->child) {
        char up[1024];
        snprintf(up, sizeof up, "%s", path);
        char *dot = strrchr(up, '.');
        if (dot) {
            *dot = 0;
            cJSON_Delete(path_detach(root, up));
        }
    }
    return v;
}

/* Translates one value through a "keys" entry; returns a new item or NULL with err set. */
static cJSON *transform(const cJSON *rule, const char *key, const cJSON *v, const char *path, char *err, size_t errlen)
{
    const cJSON *vals = cJSON_GetObjectItemCaseSensitive(rule, "values");
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(rule, "indices_of");
    if (vals) {
        char *text = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
        const char *look = cJSON_IsString(v) ? v->valuestring : text;
        const cJSON *hit = look ? cJSON_GetObjectItemCaseSensitive(vals, look) : NULL;
        if (!hit) snprintf(err, errlen, "config map %s: \"%s\" = %s%s%s has no entry in its \"values\"", path, key,
                           cJSON_IsString(v) ? "\"" : "", look ? look : "?", cJSON_IsString(v) ? "\"" : "");
        free(text);
        return hit ? cJSON_Duplicate(hit, 1) : NULL;
    }
    if (idx) {
        if (!cJSON_IsArray(v)) {
            snprintf(err, errlen, "config map %s: \"%s\" must be a list (it is mapped with \"indices_of\")", path, key);
            return NULL;
        }
        cJSON *out = cJSON_CreateArray();
        int i = 0;
        for (const cJSON *e = v->child; out && e; e = e->next, i++)
            if (cJSON_Compare(e, idx, 1)) cJSON_AddItemToArray(out, cJSON_CreateNumber(i));
        return out;
    }
    return cJSON_Duplicate(v, 1);
}

static int put(cJSON *root, const char *target, cJSON *v, const char *path, char *err, size_t errlen)
{
    char leaf[256];
    cJSON *parent = path_parent(root, target, 1, leaf, sizeof leaf);
    if (!parent || cJSON_GetObjectItemCaseSensitive(parent, leaf)) {
        snprintf(err, errlen, "config map %s: \"%s\" is written twice (or a non-object is in its path)", path, target);
        cJSON_Delete(v);
        return KDA_EFORMAT;
    }
    cJSON_AddItemToObject(parent, leaf, v);
    return 0;
}

/* Rewrites root by map m (validated). */
static int map_run(cJSON *root, const cJSON *m, const char *path, char *err, size_t errlen)
{
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(m, "keys");
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(m, "set");
    int n = 0, rc = 0;
    for (const cJSON *k = keys ? keys->child : NULL; k; k = k->next) n++;
    cJSON **moved = calloc((size_t)n + 1, sizeof *moved);
    if (!moved) {
        snprintf(err, errlen, "out of memory");
        return KDA_ENOMEM;
    }
    /* detach every mapped key first, so a target may reuse a source's name */
    int i = 0;
    for (const cJSON *k = keys ? keys->child : NULL; k; k = k->next, i++) {
        cJSON *v = path_detach(root, k->string);
        if (v && !cJSON_IsNull(k)) {
            moved[i] = cJSON_IsString(k) ? v : transform(k, k->string, v, path, err, errlen);
            if (moved[i] != v) cJSON_Delete(v);
            if (!moved[i]) {
                rc = KDA_EFORMAT;
                goto out;
            }
        } else {
            cJSON_Delete(v);
        }
    }
    i = 0;
    for (const cJSON *k = keys ? keys->child : NULL; k; k = k->next, i++) {
        if (!moved[i]) continue;
        const char *target = cJSON_IsString(k) ? k->valuestring
                                               : cJSON_GetObjectItemCaseSensitive(k, "to")->valuestring;
        cJSON *v = moved[i];
        moved[i] = NULL;
        if ((rc = put(root, target, v, path, err, errlen))) goto out;
    }
    for (const cJSON *s = set ? set->child : NULL; s; s = s->next) {
        cJSON *v = cJSON_Duplicate(s, 1);
        if (!v) MAP_FAIL("out of memory");
        if ((rc = put(root, s->string, v, path, err, errlen))) goto out;
    }
    cJSON *mt = cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(m, "engine_model_type")->valuestring);
    if (!mt || !cJSON_ReplaceItemInObjectCaseSensitive(root, "model_type", mt)) {
        cJSON_Delete(mt);
        MAP_FAIL("out of memory");
    }
out:
    for (int j = 0; j < n; j++) cJSON_Delete(moved[j]);
    free(moved);
    return rc;
}

/* Loads and validates the map at path; *match = its model_type equals mt. */
static int map_open(const char *path, const char *mt, cJSON **out, int *match, char *err, size_t errlen)
{
    *out = NULL;
    char *text = read_small_file(path, err, errlen);
    if (!text) return KDA_EIO;
    cJSON *m = cJSON_Parse(text);
    free(text);
    if (!m) {
        snprintf(err, errlen, "config map %s: not valid JSON", path);
        return KDA_EFORMAT;
    }
    int rc = map_validate(m, path, err, errlen);
    if (rc) {
        cJSON_Delete(m);
        return rc;
    }
    *match = !strcmp(cJSON_GetObjectItemCaseSensitive(m, "model_type")->valuestring, mt);
    *out = m;
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int config_map_apply(cJSON *root, const char *path, int *applied, char *err, size_t errlen)
{
    *applied = 0;
    const cJSON *mtj = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "model_type") : NULL;
    if (!cJSON_IsString(mtj)) {
        snprintf(err, errlen, "config.json: missing \"model_type\" (a config map is chosen by it)");
        return KDA_EFORMAT;
    }
    char mt[256];
    snprintf(mt, sizeof mt, "%s", mtj->valuestring);
    struct stat sb;
    if (stat(path, &sb)) {
        snprintf(err, errlen, "config map %s: %s", path, strerror(errno));
        return KDA_EIO;
    }
    cJSON *m = NULL;
    int match = 0, rc = 0;
    char chosen[4096] = "";
    if (S_ISDIR(sb.st_mode)) {
        /* a folder: the one *.configmap.json whose model_type matches, if any */
        DIR *d = opendir(path);
        if (!d) {
            snprintf(err, errlen, "config map folder %s: %s", path, strerror(errno));
            return KDA_EIO;
        }
        for (struct dirent *e; (e = readdir(d));) {
            if (!ends_with(e->d_name, ".configmap.json")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            cJSON *cand;
            int hit;
            if ((rc = map_open(p, mt, &cand, &hit, err, errlen))) break;
            if (hit && m) {
                snprintf(err, errlen, "config maps %s and %s both apply to model_type \"%s\"", chosen, p, mt);
                cJSON_Delete(cand);
                rc = KDA_EFORMAT;
                break;
            }
            if (hit) {
                m = cand;
                snprintf(chosen, sizeof chosen, "%s", p);
            } else {
                cJSON_Delete(cand);
            }
        }
        closedir(d);
        if (rc || !m) {
            cJSON_Delete(m);
            return rc;
        }
    } else {
        if ((rc = map_open(path, mt, &m, &match, err, errlen))) return rc;
        if (!match) {
            snprintf(err, errlen, "config map %s is for model_type \"%s\", but config.json has \"%s\"", path,
                     cJSON_GetObjectItemCaseSensitive(m, "model_type")->valuestring, mt);
            cJSON_Delete(m);
            return KDA_EINVAL;
        }
        snprintf(chosen, sizeof chosen, "%s", path);
    }
    rc = map_run(root, m, chosen, err, errlen);
    cJSON_Delete(m);
    if (!rc) *applied = 1;
    return rc;
}
