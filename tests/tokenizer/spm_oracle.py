#!/usr/bin/python3
"""Compares the C tokenizer with the Python sentencepiece package.

usage: spm_oracle.py TEST_SPM MODEL [test_spm options...]

Runs `TEST_SPM MODEL ... --dump CASES` to get the cases, computes the
reference with sentencepiece (Debian python3-sentencepiece; run it with
/usr/bin/python3), then runs `TEST_SPM MODEL ... --ref REF` and returns its
exit code. Exit 77 (skip) when the sentencepiece module or the shared data
is missing.

CASES, written by test_spm.c, one record per case:
    T <nbytes>\\n<raw bytes>\\n        a text to encode
    I <n> <id> <id> ...\\n             ids to decode
REF, written here, one record per case in the same order:
    E <n> <id> ...\\n                  sp.encode(text bytes) without BOS
    D <nbytes>\\n<utf-8 bytes>\\n       sp.decode(ids)
"""
import os
import subprocess
import sys
import tempfile


def shared_path(p):
    if not p.startswith("@shared/"):
        return p
    root = os.environ.get("KDA_SHARED") or os.path.join(os.environ.get("KDA_SRC", "."), "..", "shared")
    return os.path.join(root, p[len("@shared/"):])


def main():
    test_bin, model, opts = sys.argv[1], sys.argv[2], sys.argv[3:]
    for p in [model] + [o for o in opts if o.startswith("@shared/")]:
        if not os.path.exists(shared_path(p)):
            print(f"SKIP: {shared_path(p)} not found (shared data absent; set KDA_SHARED)")
            return 77
    try:
        import sentencepiece as spm
    except ImportError:
        print(f"SKIP: {sys.executable} has no sentencepiece module (apt install python3-sentencepiece)")
        return 77
    sp = spm.SentencePieceProcessor(model_file=shared_path(model))

    with tempfile.TemporaryDirectory() as tmp:
        cases, ref = os.path.join(tmp, "cases"), os.path.join(tmp, "ref")
        rc = subprocess.call([test_bin, model] + opts + ["--dump", cases])
        if rc != 0:
            return rc
        with open(cases, "rb") as f, open(ref, "wb") as out:
            data = f.read()
            pos = 0
            while pos < len(data):
                eol = data.index(b"\n", pos)
                head = data[pos:eol].split()
                pos = eol + 1
                if head[0] == b"T":
                    n = int(head[1])
                    text = data[pos:pos + n]
                    pos += n + 1
                    ids = sp.encode(text)  # bytes in: invalid UTF-8 reaches the library as is
                    out.write(b"E %d%s\n" % (len(ids), b"".join(b" %d" % i for i in ids)))
                else:
                    ids = [int(x) for x in head[2:]]
                    text = sp.decode(ids).encode("utf-8")
                    out.write(b"D %d\n%s\n" % (len(text), text))
        return subprocess.call([test_bin, model] + opts + ["--ref", ref])


if __name__ == "__main__":
    sys.exit(main())
