"""Writes a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json)
whose ids are the UTF-8 bytes of the text, no BOS or EOS: the tokenizer the demo
model serves with ("tokenizer": "bytes" in models/demo/config.json). Benchmark
clients that count tokens with transformers' AutoTokenizer load it offline.

    byte_tokenizer.py OUT_DIR

A byte-level BPE with no merges: GPT-2's byte -> printable-character table maps
each byte to one vocabulary entry, and the entry for byte b has id b, so encode
is bytes(text) and decode is its inverse. Needs `tokenizers` and `transformers`."""
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def byte_to_char():
    """GPT-2's table (as tokenizers' ByteLevel pre-tokenizer applies it): printable
    bytes stand for themselves, the rest are shifted past U+00FF in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
                 + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    table, shifted = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def main(out_dir):
    vocab = {ch: b for b, ch in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: no word splitting, so spaces stay bytes of their own (id 32)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=2048).save_pretrained(out_dir)


if __name__ == "__main__":
    main(sys.argv[1])
