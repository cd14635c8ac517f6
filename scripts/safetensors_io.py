"""safetensors_io.py - a tiny safetensors reader/writer on json + numpy.

Written for Debian's python3 (numpy 1.24, no `safetensors` package) and for
current numpy 2.x alike. Little-endian hosts only (the format is
little-endian and so is every machine this project runs on).

Writing is streaming: the header (all names, dtypes, shapes, offsets) is
written first, then each tensor's bytes in header order, so a 3.3 GB
checkpoint never sits in memory. Tensors are laid out largest dtype first
(F32 before F16/BF16, then by name) like the reference implementation, so
with the header padded to 8 bytes every tensor is aligned to its dtype.
"""
import json
import os
import struct
import sys

import numpy as np

if sys.byteorder != "little":
    raise SystemExit("safetensors_io: big-endian hosts are not supported")

ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}


# ---- bf16 <-> f32 ---------------------------------------------------------

def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even.
    NaN stays NaN (quiet), infinities stay infinite."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)  # room for the carry
    rounding = ((u >> 16) & 1) + 0x7FFF
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((a.view(np.uint32)[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits):
    """uint16 bf16 bit patterns -> float32 (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_dtype_bytes(a, dtype):
    """float array -> contiguous array whose raw bytes are `dtype` ("F32", "F16", "BF16")."""
    if dtype == "F32":
        return np.ascontiguousarray(a, dtype="<f4")
    if dtype == "F16":
        return np.ascontiguousarray(np.asarray(a, dtype=np.float32).astype("<f2"))
    if dtype == "BF16":
        return f32_to_bf16_bits(np.asarray(a, dtype=np.float32))
    raise ValueError("unsupported dtype %r" % dtype)


# ---- writing ----------------------------------------------------------------

def numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def layout(specs, metadata=None):
    """specs: list of (name, dtype, shape). Returns (ordered specs, header bytes).
    Order: dtype size descending, then name (keeps every tensor aligned).
    metadata: extra string entries for __metadata__."""
    order = sorted(specs, key=lambda s: (-ITEMSIZE[s[1]], s[0]))
    hdr = {"__metadata__": {"format": "pt", **{k: str(v) for k, v in (metadata or {}).items()}}}
    off = 0
    for name, dtype, shape in order:
        nb = numel(shape) * ITEMSIZE[dtype]
        hdr[name] = {"dtype": dtype, "shape": [int(s) for s in shape],
                     "data_offsets": [off, off + nb]}
        off += nb
    raw = json.dumps(hdr, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    return order, raw


def write_file(path, specs, fill, metadata=None):
    """Streams one .safetensors file. specs: list of (name, dtype, shape).
    fill(name, dtype, shape) yields contiguous numpy arrays whose raw bytes,
    concatenated, are the tensor's data (already in `dtype`). The byte count
    of every tensor is checked. Returns the data size in bytes."""
    order, raw = layout(specs, metadata)
    tmp = path + ".tmp"
    total = 0
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, dtype, shape in order:
            want = numel(shape) * ITEMSIZE[dtype]
            got = 0
            for part in fill(name, dtype, shape):
                part = np.ascontiguousarray(part)
                fh.write(memoryview(part).cast("B"))
                got += part.nbytes
            if got != want:
                raise RuntimeError("%s: wrote %d bytes, expected %d" % (name, got, want))
            total += got
    os.replace(tmp, path)
    return total


def save(path, tensors, metadata=None):
    """Convenience for small files: tensors = {name: (dtype, float array)}."""
    specs = [(n, dt, tuple(np.shape(a))) for n, (dt, a) in tensors.items()]
    write_file(path, specs, lambda n, dt, sh: [to_dtype_bytes(tensors[n][1], dt)], metadata)


# ---- reading ----------------------------------------------------------------

def read_header(path):
    """Returns (header dict without __metadata__, absolute offset of the data section)."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        hdr = json.loads(fh.read(n).decode("utf-8"))
    hdr.pop("__metadata__", None)
    return hdr, 8 + n


class TensorStore:
    """All tensors of a checkpoint directory (single file or index + shards),
    read lazily through a memory map."""

    def __init__(self, d):
        single = os.path.join(d, "model.safetensors")
        index = os.path.join(d, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError("%s: no model.safetensors or model.safetensors.index.json" % d)
        self.entries = {}  # name -> (memmap, dtype, shape, begin, end)
        for f in files:
            p = os.path.join(d, f)
            hdr, base = read_header(p)
            mm = np.memmap(p, dtype=np.uint8, mode="r")
            for name, e in hdr.items():
                if name in self.entries:
                    raise ValueError("%s: tensor %s appears in two shards" % (d, name))
                b, en = e["data_offsets"]
                self.entries[name] = (mm, e["dtype"], tuple(e["shape"]), base + b, base + en)

    def __contains__(self, name):
        return name in self.entries

    def names(self):
        return sorted(self.entries)

    def dtype(self, name):
        return self.entries[name][1]

    def shape(self, name):
        return self.entries[name][2]

    def get(self, name):
        """The tensor as a float32 numpy array (exact for all three dtypes)."""
        mm, dtype, shape, b, e = self.entries[name]
        kinds = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
        if dtype not in kinds:
            raise ValueError("%s: unsupported dtype %s" % (name, dtype))
        n = numel(shape)
        if n * ITEMSIZE[dtype] != e - b:
            raise ValueError("%s: %d bytes for shape %s" % (name, e - b, shape))
        raw = np.frombuffer(mm, dtype=kinds[dtype], count=n, offset=b)  # a view of the mapping
        if dtype == "BF16":
            a = bf16_bits_to_f32(raw)
        else:
            a = raw.astype(np.float32)  # copies: callers own the result
        return a.reshape(shape)
