/*
 * spm_shim.cpp - libsentencepiece behind the C interface of spm_shim.h.
 * No C++ exception may cross into C: every entry point that allocates
 * catches and turns failures into a message.
 */
#include "spm_shim.h"

#include <sentencepiece_processor.h>

#include "kda_file.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

struct spm_model {
    sentencepiece::SentencePieceProcessor sp;
    int vocab;
};

static void set_err(char *err, size_t errlen, const std::string &what, const std::string &why) {
    if (err && errlen) snprintf(err, errlen, "tokenizer: %s: %s", what.c_str(), why.c_str());
}

/* The file is read here (kda_file: a regular file under the tokenizer cap,
 * never a FIFO or /dev/zero) and handed over as bytes; SentencePiece's own
 * Load(path) would open anything. The model is owned by a unique_ptr until
 * it is returned, so no failure path (an exception included) leaks it. */
extern "C" spm_model *spm_load(const char *path, char *err, size_t errlen) {
    try {
        char why[512];
        size_t len = 0;
        std::unique_ptr<char, decltype(&free)> bytes(kda_file_read(path, KDA_MAX_TOKENIZER_BYTES, &len, why, sizeof why),
                                                     &free);
        if (!bytes) {
            if (err && errlen) snprintf(err, errlen, "tokenizer: %s", why);
            return nullptr;
        }
        auto m = std::make_unique<spm_model>();
        const auto st = m->sp.LoadFromSerializedProto(std::string_view(bytes.get(), len));
        if (!st.ok()) {
            set_err(err, errlen, std::string("cannot load ") + path, st.ToString());
            return nullptr;
        }
        m->vocab = m->sp.GetPieceSize();
        return m.release();
    } catch (const std::exception &e) {
        set_err(err, errlen, std::string("cannot load ") + path, e.what());
        return nullptr;
    }
}

extern "C" void spm_free(spm_model *m) { delete m; }

extern "C" int spm_vocab_size(const spm_model *m) { return m->vocab; }
extern "C" int spm_bos_id(const spm_model *m) { return m->sp.bos_id(); }
extern "C" int spm_eos_id(const spm_model *m) { return m->sp.eos_id(); }
extern "C" int spm_unk_id(const spm_model *m) { return m->sp.unk_id(); }
extern "C" int spm_is_byte(const spm_model *m, int32_t id) { return m->sp.IsByte(id) ? 1 : 0; }

extern "C" const char *spm_id_to_piece(const spm_model *m, int32_t id) {
    return m->sp.IdToPiece(id).c_str();   /* a reference into the model */
}

extern "C" int32_t spm_piece_to_id(const spm_model *m, const char *piece) {
    /* SentencePiece maps every unknown piece to unk_id; only "<unk>" itself is that id. */
    const int id = m->sp.PieceToId(piece);
    if (id == m->sp.unk_id() && m->sp.IdToPiece(id) != piece) return -1;
    return id;
}

extern "C" int spm_encode(const spm_model *m, const char *text, size_t len, int32_t **ids,
                          int *n_ids, char *err, size_t errlen) {
    *ids = nullptr;
    *n_ids = 0;
    try {
        std::vector<int> out;
        const auto st = m->sp.Encode(std::string_view(text, len), &out);
        if (!st.ok()) {
            set_err(err, errlen, "encode failed", st.ToString());
            return -1;
        }
        int32_t *buf = (int32_t *)malloc((out.size() + 1) * sizeof(int32_t));
        if (!buf) throw std::bad_alloc();
        for (size_t i = 0; i < out.size(); i++) buf[i] = out[i];
        *ids = buf;
        *n_ids = (int)out.size();
        return 0;
    } catch (const std::exception &e) {
        set_err(err, errlen, "encode failed", e.what());
        return -1;
    }
}

extern "C" int spm_decode(const spm_model *m, const int32_t *ids, int n_ids, char **text,
                          size_t *len, char *err, size_t errlen) {
    *text = nullptr;
    *len = 0;
    try {
        std::vector<int> in(ids, ids + n_ids);
        std::string out;
        const auto st = m->sp.Decode(in, &out);
        if (!st.ok()) {
            set_err(err, errlen, "decode failed", st.ToString());
            return -1;
        }
        char *buf = (char *)malloc(out.size() + 1);
        if (!buf) throw std::bad_alloc();
        memcpy(buf, out.data(), out.size());
        buf[out.size()] = '\0';
        *text = buf;
        *len = out.size();
        return 0;
    } catch (const std::exception &e) {
        set_err(err, errlen, "decode failed", e.what());
        return -1;
    }
}
