#!/usr/bin/env python3
"""train.py - train a small hybrid KDA:GQA language model and export it in
the checkpoint format kda-server and kda-cli load (MODEL_SPEC.md section 5).

  train.py train  --data FILE --out RUN [model / optimiser flags]   # trains, exports RUN/export
  train.py eval   --model DIR --data FILE                           # held-out loss of an export
  train.py sample --model DIR --prompt "ROMEO:"                     # continue a prompt
  train.py export --ckpt RUN/ckpt.pt --out DIR [--dtype bf16]

Data: one UTF-8 text file; the last --val-frac of it (by bytes for byte
tokens, by characters otherwise) is held out and never trained on.

Held-out loss (the one definition used everywhere, model card included):
the held-out token stream is cut into windows starting every --ctx tokens;
each window is scored from an empty state and every token of the stream is
predicted exactly once: byte models (no BOS) use windows of ctx+1 tokens
overlapping by one and predict tokens 1..ctx of each window (the stream's
first token is never predicted); models with a BOS id prepend BOS to each
window of ctx tokens and predict all of them. Loss = total nats / number of
predicted tokens; per byte = total nats / UTF-8 bytes of the predicted tokens.

Runs with Debian's python3-torch 1.13 on the CPU and with current PyTorch on
CUDA (bf16/fp16 autocast). Resume is exact: every random draw (batch
positions, dropout) is seeded from (seed, step, micro-step), not from a
running generator.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kda_torch as kt  # noqa: E402

# ----------------------------------------------------------------------------
# tokenizers


class ByteTokenizer:
    vocab_size = 256
    bos_id = None
    eos_id = None
    model_file = None

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def n_bytes(self, ids):
        return len(ids)


class SPTokenizer:
    def __init__(self, path):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.model_file = path
        self.vocab_size = self.sp.get_piece_size()
        self.bos_id = self.sp.bos_id() if self.sp.bos_id() >= 0 else None
        self.eos_id = self.sp.eos_id() if self.sp.eos_id() >= 0 else None

    def encode(self, text):
        return self.sp.encode(text)

    def decode(self, ids):
        return self.sp.decode([int(i) for i in ids])

    def n_bytes(self, ids):
        return len(self.decode(ids).encode("utf-8"))


def make_tokenizer(spec, train_text=None, out_dir=None):
    """'bytes', a path to a SentencePiece .model, or 'train:N' (train an N-piece BPE on the training split)."""
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("train:"):
        import sentencepiece as spm
        n = int(spec.split(":", 1)[1])
        os.makedirs(out_dir, exist_ok=True)
        src = os.path.join(out_dir, "spm_train.txt")
        with open(src, "w", encoding="utf-8") as f:
            f.write(train_text)
        prefix = os.path.join(out_dir, "tokenizer")
        spm.SentencePieceTrainer.train(input=src, model_prefix=prefix, vocab_size=n, model_type="bpe",
                                       byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2,
                                       unk_id=0, pad_id=-1, num_threads=1, minloglevel=2)
        os.remove(src)
        return SPTokenizer(prefix + ".model")
    return SPTokenizer(spec)


def tokenizer_for_export(model_dir):
    p = os.path.join(model_dir, "tokenizer.model")
    return SPTokenizer(p) if os.path.exists(p) else ByteTokenizer()


# ----------------------------------------------------------------------------
# data


def split_text(path, val_frac):
    """-> (train_text, heldout_text). Byte split for byte tokens keeps the card's figure byte-exact."""
    raw = open(path, "rb").read()
    cut = len(raw) - int(len(raw) * val_frac)
    while 0 < cut < len(raw) and (raw[cut] & 0xC0) == 0x80:   # do not split a UTF-8 sequence
        cut += 1
    return raw[:cut].decode("utf-8"), raw[cut:].decode("utf-8")


def step_generator(seed, step, micro):
    g = torch.Generator()
    g.manual_seed((seed * 1000003 + step * 1009 + micro) % (2 ** 63))
    return g


def get_batch(data, ctx, batch, bos, g):
    """Random windows of the training stream. -> inputs [B, ctx], targets [B, ctx]."""
    span = ctx + 1 if bos is None else ctx
    ix = torch.randint(0, len(data) - span + 1, (batch,), generator=g)
    w = torch.stack([data[i:i + span] for i in ix.tolist()])
    if bos is not None:
        w = torch.cat([torch.full((batch, 1), bos, dtype=w.dtype), w], 1)
    return w[:, :-1], w[:, 1:]


def heldout_windows(ids, ctx, bos):
    """The held-out windows of the module docstring's definition; list of 1-D tensors (input+target)."""
    out = []
    if bos is None:
        for s in range(0, len(ids) - 1, ctx):
            w = ids[s:s + ctx + 1]
            if len(w) >= 2:
                out.append(w)
    else:
        for s in range(0, len(ids), ctx):
            out.append(torch.cat([torch.tensor([bos], dtype=ids.dtype), ids[s:s + ctx]]))
    return out


@torch.no_grad()
def heldout_loss(model, windows, device, batch=32, amp=None, tok=None):
    """-> dict(nats_per_token, nats_per_byte, tokens, bytes, windows)."""
    was = model.training
    model.eval()
    total, count, nbytes = 0.0, 0, 0
    # equal-length windows batch together; the last (short) one alone
    groups = {}
    for w in windows:
        groups.setdefault(len(w), []).append(w)
    for L, ws in groups.items():
        for i in range(0, len(ws), batch):
            x = torch.stack(ws[i:i + batch]).to(device)
            with amp_ctx(device, amp):
                logits = model(x[:, :-1])
            lp = F.log_softmax(logits.float(), -1)
            nll = -lp.gather(-1, x[:, 1:, None]).squeeze(-1)
            total += nll.double().sum().item()
            count += nll.numel()
            if tok is not None and not isinstance(tok, ByteTokenizer):
                nbytes += sum(tok.n_bytes(r[1:].tolist()) for r in x.cpu())
    model.train(was)
    if tok is None or isinstance(tok, ByteTokenizer):
        nbytes = count
    return {"nats_per_token": total / max(count, 1), "nats_per_byte": total / max(nbytes, 1),
            "tokens": count, "bytes": nbytes, "windows": len(windows)}


# ----------------------------------------------------------------------------
# device, precision


def pick_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def amp_ctx(device, amp):
    if device.startswith("cuda") and amp in ("bf16", "fp16"):
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16 if amp == "bf16" else torch.float16)
    return kt._Null()


def torch_load(path):
    """Our own checkpoints hold plain Python values beside tensors (PyTorch >= 2.6 defaults to weights_only)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except TypeError:   # torch 1.13 has no weights_only
        return torch.load(path, map_location="cpu")


def fmt_time(s):
    s = int(max(s, 0))
    return "%dh%02dm" % (s // 3600, s % 3600 // 60) if s >= 3600 else "%dm%02ds" % (s // 60, s % 60)


# ----------------------------------------------------------------------------
# sampling (recomputes the last ctx tokens per step: simple, and fine for monitoring)


@torch.no_grad()
def generate(model, ids, n, ctx, temperature=0.8, top_k=0, seed=0, device="cpu", amp=None):
    was = model.training
    model.eval()
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    out = list(ids)
    for _ in range(n):
        x = torch.tensor([out[-ctx:]], device=device)
        with amp_ctx(device, amp):
            logits = model(x)[0, -1].float().cpu()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g))
        out.append(nxt)
    model.train(was)
    return out[len(ids):]


# ----------------------------------------------------------------------------
# model construction, dropout


def config_from_args(a, tok):
    n = a.layers
    return kt.KDAConfig(
        hidden_size=a.d_model, num_hidden_layers=n, num_heads=a.kda_heads, head_dim=a.kda_head_dim,
        expand_v=a.expand_v, conv_size=a.conv_size, intermediate_size=a.ffn, norm_eps=a.norm_eps,
        vocab_size=tok.vocab_size, tie_word_embeddings=not a.untied, bos_token_id=tok.bos_id,
        eos_token_id=tok.eos_id, max_position_embeddings=a.max_pos,
        tokenizer="bytes" if isinstance(tok, ByteTokenizer) else "sentencepiece",
        attn={"layers": kt.layer_pattern_to_attn_layers(a.pattern, n), "num_heads": a.gqa_heads,
              "num_kv_heads": a.gqa_kv_heads, "head_dim": a.gqa_head_dim, "rope_theta": a.rope_theta,
              "partial_rotary_factor": a.rope_frac})


def add_dropout(model, p):
    """Residual dropout after each mixer and MLP (training only; exports are unaffected)."""
    for blk in model.model.layers:
        blk.dropout = p


def param_groups(model, wd):
    decay, no = [], []
    for n, p in model.named_parameters():
        # matrices decay; norms, biases, conv taps and the gate's A_log/dt_bias do not
        (decay if p.dim() == 2 else no).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no, "weight_decay": 0.0}]


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = min(1.0, (step - a.warmup) / max(1, a.steps - a.warmup))
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * t))


# ----------------------------------------------------------------------------
# train


def cmd_train(a):
    torch.manual_seed(a.seed)
    if a.threads:
        torch.set_num_threads(a.threads)
    device = pick_device(a.device)
    amp = a.dtype if device.startswith("cuda") else None
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    ckpt_path = os.path.join(a.out, "ckpt.pt")
    resume = None
    if a.resume:
        if not os.path.exists(ckpt_path):
            sys.exit("--resume: no checkpoint at %s" % ckpt_path)
        resume = torch_load(ckpt_path)
        # flags that change what is trained must match; monitoring flags may differ
        free = {"resume", "stop_after", "log_every", "eval_every", "eval_windows", "eval_batch", "ckpt_every",
                "sample_every", "prompt", "sample_len", "temperature", "top_k", "export", "export_dtype",
                "threads", "compile", "kda_impl", "chunk", "device"}
        diff = [k for k, v in vars(a).items() if k not in free and resume["args"].get(k) != v]
        if diff:
            sys.exit("--resume: --%s differs from the checkpoint's run" % diff[0].replace("_", "-"))

    train_text, val_text = split_text(a.data, a.val_frac)
    tok_spec = a.tokenizer
    if resume and resume.get("tokenizer_file"):
        tok_spec = resume["tokenizer_file"]
    tok = make_tokenizer(tok_spec, train_text, a.out)
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text), dtype=torch.long)
    cfg = config_from_args(a, tok)
    if resume and resume["config"] != cfg.to_json_dict():
        sys.exit("--resume: the model flags differ from the checkpoint's config")

    model = kt.KDAForCausalLM(cfg)
    model.set_kda_impl(a.kda_impl, a.chunk)
    add_dropout(model, a.dropout)
    model.to(device)
    opt = torch.optim.AdamW(param_groups(model, a.wd), lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=(amp == "fp16"))
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=(amp == "fp16"))
    step, elapsed_before, tokens_seen = 0, 0.0, 0
    if resume:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        scaler.load_state_dict(resume["scaler"])
        step, elapsed_before, tokens_seen = resume["step"], resume["elapsed"], resume["tokens_seen"]
    if a.compile and not hasattr(torch, "compile"):
        print("note: --compile needs PyTorch 2; running eagerly", file=sys.stderr)
    fwd = torch.compile(model) if a.compile and hasattr(torch, "compile") else model

    val_windows = heldout_windows(val_ids, a.ctx, cfg.bos_token_id)
    eval_subset = val_windows[:a.eval_windows] if a.eval_windows else val_windows
    log = open(os.path.join(a.out, "train.log"), "a")

    def say(s):
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    kda_path = "fla" if (kt.fla_kernel() and device.startswith("cuda") and a.kda_impl in ("auto", "fla")) \
        else ("chunked(%d)" % a.chunk if a.kda_impl in ("auto", "chunked") else a.kda_impl)
    say("# %s | %s params | device %s%s | kda %s | train %d tokens, held-out %d tokens (%d windows) | %s"
        % (" ".join(sys.argv), f"{model.num_params():,}", device,
           (" " + torch.cuda.get_device_name()) if device.startswith("cuda") else " threads=%d" % torch.get_num_threads(),
           kda_path, len(train_ids), len(val_ids), len(val_windows), "resumed at step %d" % step if resume else "fresh"))

    def save_ckpt():
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "scaler": scaler.state_dict(),
                 "step": step, "elapsed": elapsed_before + time.time() - t0, "tokens_seen": tokens_seen,
                 "config": cfg.to_json_dict(), "args": vars(a), "tokenizer_file": tok.model_file}
        torch.save(state, ckpt_path + ".tmp")
        os.replace(ckpt_path + ".tmp", ckpt_path)

    t0 = time.time()
    tok_per_step = a.batch * a.accum * a.ctx
    t_last, tok_last = time.time(), 0
    losses = []
    stop_at = min(a.steps, a.stop_after) if a.stop_after else a.steps
    model.train()
    while step < stop_at:
        lr = lr_at(step, a)
        for gr in opt.param_groups:
            gr["lr"] = lr
        torch.manual_seed(a.seed * 7919 + step)   # dropout draws: a function of the step only
        loss_sum = 0.0
        for micro in range(a.accum):
            x, y = get_batch(train_ids, a.ctx, a.batch, cfg.bos_token_id, step_generator(a.seed, step, micro))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with amp_ctx(device, amp):
                logits = fwd(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1))
            scaler.scale(loss / a.accum).backward()
            loss_sum += loss.detach()
        scaler.unscale_(opt)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip) if a.clip > 0 else torch.tensor(0.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tok_per_step
        tok_last += tok_per_step
        if step % a.log_every == 0 or step == stop_at:
            lv = float(loss_sum) / a.accum
            losses.append((step, lv))
            now = time.time()
            tps = tok_last / max(now - t_last, 1e-9)
            t_last, tok_last = now, 0
            eta = (a.steps - step) * tok_per_step / max(tps, 1e-9)
            say("step %6d/%d | loss %.4f | lr %.2e | gnorm %.2f | %.1fk tok/s | elapsed %s | eta %s"
                % (step, a.steps, lv, lr, float(gnorm), tps / 1e3, fmt_time(elapsed_before + now - t0), fmt_time(eta)))
        if a.eval_every and (step % a.eval_every == 0 or step == a.steps):
            r = heldout_loss(model, eval_subset, device, a.eval_batch, amp, tok)
            say("eval step %d | held-out %.4f nats/token, %.4f nats/byte (%d windows)"
                % (step, r["nats_per_token"], r["nats_per_byte"], r["windows"]))
            t_last = time.time()
        if a.sample_every and step % a.sample_every == 0:
            s = generate(model, tok.encode(a.prompt), a.sample_len, a.ctx, a.temperature, a.top_k, a.seed, device, amp)
            say("sample step %d: %r" % (step, a.prompt + tok.decode(s)))
            t_last = time.time()
        if a.ckpt_every and step % a.ckpt_every == 0:
            save_ckpt()
    save_ckpt()
    train_time = elapsed_before + time.time() - t0
    if step < a.steps:
        say("stopped at step %d of %d (--stop-after); resume with --resume" % (step, a.steps))
        return

    # Export, then measure what was exported: the figure must be the engine's model, not the trainer's.
    export_dir = a.export or os.path.join(a.out, "export")
    meta = {"trainer": "scripts/train.py", "steps": step, "seed": a.seed}
    kt.export_model(model.cpu(), export_dir, dtype=a.export_dtype.upper(), tokenizer_model=tok.model_file,
                    metadata=meta)
    if device.startswith("cuda"):   # the figure is fp32 math, as the CPU engine computes it
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    em = kt.load_exported(export_dir, device)
    em.set_kda_impl("chunked" if a.kda_impl == "fla" else a.kda_impl, a.chunk)
    r = heldout_loss(em, val_windows, device, a.eval_batch, None, tok)  # fp32 math, as the CPU engine
    sample = generate(em, tok.encode(a.prompt), a.sample_len, a.ctx, a.temperature, a.top_k, a.seed, device)
    res = {"heldout": r, "ctx": a.ctx, "val_frac": a.val_frac, "steps": step, "tokens_seen": tokens_seen,
           "train_time_s": round(train_time, 1), "params": em.num_params(), "export_dtype": a.export_dtype,
           "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu x%d" % torch.get_num_threads(),
           "torch": torch.__version__, "kda_impl": kda_path, "command": " ".join(sys.argv),
           "sample_prompt": a.prompt, "sample": a.prompt + tok.decode(sample),
           "last_train_loss": losses[-1][1] if losses else None}
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(res, f, indent=2)
    say("final (exported %s weights, fp32 math) held-out %.4f nats/token, %.4f nats/byte over %d tokens | train time %s"
        % (a.export_dtype, r["nats_per_token"], r["nats_per_byte"], r["tokens"], fmt_time(train_time)))
    say("sample: %r" % res["sample"])


# ----------------------------------------------------------------------------
# eval / sample / export


def load_model_dir(a):
    device = pick_device(a.device)
    m = kt.load_exported(a.model, device)
    m.set_kda_impl(a.kda_impl, a.chunk)
    return m, tokenizer_for_export(a.model), device


def cmd_eval(a):
    if a.threads:
        torch.set_num_threads(a.threads)
    m, tok, device = load_model_dir(a)
    _, val_text = split_text(a.data, a.val_frac)
    ids = torch.tensor(tok.encode(val_text), dtype=torch.long)
    if a.max_tokens:
        ids = ids[:a.max_tokens]
    r = heldout_loss(m, heldout_windows(ids, a.ctx, m.config.bos_token_id), device, a.eval_batch, None, tok)
    print(json.dumps(r))


def cmd_sample(a):
    if a.threads:
        torch.set_num_threads(a.threads)
    m, tok, device = load_model_dir(a)
    s = generate(m, tok.encode(a.prompt), a.sample_len, a.ctx, a.temperature, a.top_k, a.seed, device)
    print(a.prompt + tok.decode(s))


def cmd_export(a):
    st = torch_load(a.ckpt)
    cfg = kt.KDAConfig.from_json_dict(st["config"])
    m = kt.KDAForCausalLM(cfg)
    m.load_state_dict(st["model"])
    kt.export_model(m, a.out, dtype=a.dtype.upper(), tokenizer_model=st.get("tokenizer_file"),
                    metadata={"trainer": "scripts/train.py", "steps": st["step"]})
    print("exported step %d to %s (%s)" % (st["step"], a.out, a.dtype))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train, then export and measure the held-out loss")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True, help="run directory: train.log, ckpt.pt, export/, result.json")
    t.add_argument("--export", default=None, help="export directory (default RUN/export)")
    t.add_argument("--export-dtype", default="bf16", choices=["f32", "bf16", "f16"])
    t.add_argument("--tokenizer", default="bytes", help="bytes | PATH.model | train:N")
    t.add_argument("--val-frac", type=float, default=0.1)
    # shape
    t.add_argument("--d-model", type=int, default=256)
    t.add_argument("--layers", type=int, default=8)
    t.add_argument("--pattern", default="KKKG", help="layer kinds, repeated: K = KDA, G = GQA")
    t.add_argument("--kda-heads", type=int, default=4)
    t.add_argument("--kda-head-dim", type=int, default=64)
    t.add_argument("--expand-v", type=float, default=1.0)
    t.add_argument("--conv-size", type=int, default=4)
    t.add_argument("--ffn", type=int, default=704)
    t.add_argument("--gqa-heads", type=int, default=4)
    t.add_argument("--gqa-kv-heads", type=int, default=2)
    t.add_argument("--gqa-head-dim", type=int, default=64)
    t.add_argument("--rope-frac", type=float, default=0.25, help="partial_rotary_factor")
    t.add_argument("--rope-theta", type=float, default=10000.0)
    t.add_argument("--norm-eps", type=float, default=1e-6)
    t.add_argument("--untied", action="store_true", help="separate lm_head")
    t.add_argument("--max-pos", type=int, default=2048, help="max_position_embeddings written to config.json")
    # optimisation
    t.add_argument("--ctx", type=int, default=256)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--accum", type=int, default=1, help="gradient accumulation micro-steps")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--stop-after", type=int, default=0, help="stop (and checkpoint) after this step; schedule unchanged")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--min-lr", type=float, default=1e-4)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--wd", type=float, default=0.1)
    t.add_argument("--beta1", type=float, default=0.9)
    t.add_argument("--beta2", type=float, default=0.95)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--seed", type=int, default=1337)
    t.add_argument("--device", default="auto")
    t.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"], help="autocast dtype on CUDA (the CPU always trains in fp32)")
    t.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch default)")
    t.add_argument("--kda-impl", default="auto", choices=["auto", "chunked", "recurrent", "fla"])
    t.add_argument("--chunk", type=int, default=16, help="chunk length of the PyTorch chunked KDA")
    t.add_argument("--compile", action="store_true", help="torch.compile the model (PyTorch 2)")
    # monitoring
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--eval-every", type=int, default=200)
    t.add_argument("--eval-windows", type=int, default=64, help="held-out windows for periodic evals (0 = all)")
    t.add_argument("--eval-batch", type=int, default=32)
    t.add_argument("--ckpt-every", type=int, default=500)
    t.add_argument("--resume", action="store_true", help="continue RUN/ckpt.pt")
    t.add_argument("--sample-every", type=int, default=0)
    t.add_argument("--prompt", default="ROMEO:")
    t.add_argument("--sample-len", type=int, default=200)
    t.add_argument("--temperature", type=float, default=0.8)
    t.add_argument("--top-k", type=int, default=0)

    for name in ("eval", "sample"):
        e = sub.add_parser(name)
        e.add_argument("--model", required=True, help="exported checkpoint directory")
        e.add_argument("--device", default="cpu")
        e.add_argument("--threads", type=int, default=0)
        e.add_argument("--kda-impl", default="chunked", choices=["auto", "chunked", "recurrent", "fla"])
        e.add_argument("--chunk", type=int, default=16)
        e.add_argument("--ctx", type=int, default=256)
        e.add_argument("--seed", type=int, default=1337)
        if name == "eval":
            e.add_argument("--data", required=True)
            e.add_argument("--val-frac", type=float, default=0.1)
            e.add_argument("--max-tokens", type=int, default=0, help="score only the first N held-out tokens")
            e.add_argument("--eval-batch", type=int, default=32)
        else:
            e.add_argument("--prompt", default="ROMEO:")
            e.add_argument("--sample-len", type=int, default=200)
            e.add_argument("--temperature", type=float, default=0.8)
            e.add_argument("--top-k", type=int, default=0)

    x = sub.add_parser("export")
    x.add_argument("--ckpt", required=True)
    x.add_argument("--out", required=True)
    x.add_argument("--dtype", default="bf16", choices=["f32", "bf16", "f16"])

    a = p.parse_args(argv)
    {"train": cmd_train, "eval": cmd_eval, "sample": cmd_sample, "export": cmd_export}[a.cmd](a)


if __name__ == "__main__":
    main()
