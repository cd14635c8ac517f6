/*
 * fuzz_st_index.c - sharded checkpoints: model.safetensors.index.json and
 * the shards it names (engine/safetensors.c, st_open_dir).
 *
 * Input: the index file's contents. It is written into a model directory
 * made once per process, which also holds three small shards: a.safetensors
 * (tensors "x", "y"), b.safetensors ("z"), dup.safetensors ("x" again), and
 * a folder sub/ with a shard inside (a name like "sub/a.safetensors" or
 * "../..." must be refused: shard names are plain file names).
 * Checks: an accepted directory opened only files directly inside it, each
 * once; every tensor the index maps is in the shard it names, and every
 * tensor of an opened shard is findable; a rejected one says why.
 */
#include "fuzz_common.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "safetensors.h"

static char dir[64];
static char index_path[128];

static void write_file(const char *name, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) abort();
}

/* A shard holding F32 tensors of one element each, in the order given. */
static void write_shard(const char *name, const char *const *tensors, int n)
{
    char header[512];
    size_t o = (size_t)snprintf(header, sizeof header, "{");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(header + o, sizeof header - o, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
                              "\"data_offsets\":[%d,%d]}", i ? "," : "", tensors[i], 4 * i, 4 * i + 4);
    o += (size_t)snprintf(header + o, sizeof header - o, "}");
    while (o % 8) header[o++] = ' ';
    unsigned char file[1024] = {0};
    for (int i = 0; i < 8; i++) file[i] = (unsigned char)((uint64_t)o >> (8 * i));
    memcpy(file + 8, header, o);
    write_file(name, file, 8 + o + 4 * (size_t)n);
}

static void cleanup(void)
{
    static const char *const names[] = {"a.safetensors", "b.safetensors", "dup.safetensors",
                                        "sub/a.safetensors", "model.safetensors.index.json"};
    char path[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/sub", dir);
    rmdir(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* tmpfs when there is one: every input is a file write and three mmaps */
    snprintf(dir, sizeof dir, "/dev/shm/kda-fuzz-st-index.XXXXXX");
    if (!mkdtemp(dir)) {
        snprintf(dir, sizeof dir, "/tmp/kda-fuzz-st-index.XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    atexit(cleanup);
    write_shard("a.safetensors", (const char *const[]){"x", "y"}, 2);
    write_shard("b.safetensors", (const char *const[]){"z"}, 1);
    write_shard("dup.safetensors", (const char *const[]){"x"}, 1);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    if (mkdir(sub, 0700)) abort();
    write_shard("sub/a.safetensors", (const char *const[]){"w"}, 1);
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f = fopen(index_path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f)) abort();
    st_set *s = NULL;
    char err[1024] = "";
    int rc = st_open_dir(&s, dir, err, sizeof err);
    if (rc) {
        FZ_CHECK(rc == -1 && s == NULL && err[0], "rejected (%d) without a message or with a set", rc);
        return 0;
    }
    size_t dl = strlen(dir);
    for (int i = 0; i < s->n_files; i++) {
        const char *p = s->files[i].path;
        FZ_CHECK(!strncmp(p, dir, dl) && p[dl] == '/' && !strchr(p + dl + 1, '/') && strcmp(p + dl + 1, "..") &&
                     strcmp(p + dl + 1, "."),
                 "opened %s, not a file directly in the model directory", p);
        for (int k = 0; k < i; k++) FZ_CHECK(strcmp(p, s->files[k].path), "opened %s twice", p);
    }
    for (int i = 0; i < s->n_tensors; i++) {
        const st_tensor *t = &s->tensors[i];
        FZ_CHECK(t->file >= 0 && t->file < s->n_files && st_find(s, t->name) == t, "tensor %s", t->name);
        FZ_CHECK(*(const volatile float *)t->data == 0.0f, "tensor %s reads %g", t->name, *(const float *)t->data);
    }
    /* every mapped tensor is in its named shard (what st_open_dir promises) */
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    FZ_CHECK(cJSON_IsObject(wm), "accepted an index without a weight_map object");
    for (const cJSON *e = wm->child; e; e = e->next) {
        const st_tensor *t = st_find(s, e->string);
        FZ_CHECK(t && cJSON_IsString(e), "mapped tensor %s missing", e->string);
        const char *in = strrchr(s->files[t->file].path, '/') + 1;
        FZ_CHECK(!strcmp(in, e->valuestring), "tensor %s mapped to %s but found in %s", e->string, e->valuestring, in);
    }
    cJSON_Delete(root);
    st_close(s);
    return 0;
}
