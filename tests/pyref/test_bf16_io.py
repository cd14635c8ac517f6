"""safetensors_io: bf16 rounding is round-to-nearest-even (checked against
torch), files round-trip, and the generator's fast bf16 bits have the scale
asked for."""
import os

import numpy as np
import torch

from pyref_common import TMP, run_tests
import gen_checkpoint as gc
import safetensors_io as st


def test_bf16_rounding_matches_torch():
    g = np.random.default_rng(0)
    x = np.concatenate([
        g.standard_normal(10000).astype(np.float32) * 10.0 ** g.integers(-30, 30, 10000),
        # exact ties: mantissa low half 0x8000, odd and even upper halves
        (np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7FFFFF, 0x00008000, 0x00018000],
                  dtype=np.uint32)).view(np.float32),
        np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.4e38], dtype=np.float32)])
    got = st.f32_to_bf16_bits(x)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(got, want), np.nonzero(got != want)
    assert np.isnan(st.bf16_bits_to_f32(st.f32_to_bf16_bits(np.array([np.nan], np.float32))))[0]
    back = st.bf16_bits_to_f32(got)
    assert np.array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())


def test_save_and_load_round_trip_all_dtypes():
    g = np.random.default_rng(1)
    a = g.standard_normal((3, 5)).astype(np.float32)
    b = g.standard_normal((7,)).astype(np.float32)
    c = g.standard_normal((2, 1, 4)).astype(np.float32)
    d = os.path.join(TMP, "rt")
    os.makedirs(d)
    st.save(os.path.join(d, "model.safetensors"), {"a": ("F32", a), "b": ("F16", b), "c": ("BF16", c)})
    s = st.TensorStore(d)
    assert np.array_equal(s.get("a"), a)
    assert np.array_equal(s.get("b"), b.astype(np.float16).astype(np.float32))
    assert np.array_equal(s.get("c"), st.bf16_bits_to_f32(st.f32_to_bf16_bits(c)).reshape(c.shape))
    assert s.shape("c") == (2, 1, 4) and s.dtype("b") == "F16"
    hdr, base = st.read_header(os.path.join(d, "model.safetensors"))
    assert base % 8 == 0 and hdr["a"]["data_offsets"][0] == 0  # F32 first, aligned


def test_fast_bits_have_the_requested_scale_and_no_zeros():
    for sigma in (0.01, 0.0221, 0.3):
        bits = gc.fast_bits(np.random.default_rng(2), 1 << 20, sigma)
        x = st.bf16_bits_to_f32(bits).astype(np.float64)
        rms = np.sqrt((x * x).mean())
        assert 1 / 1.45 < rms / sigma < 1.45, (sigma, rms)
        assert np.all(np.isfinite(x)) and np.all(x != 0)
        assert abs(x.mean()) < 0.01 * rms and abs((x > 0).mean() - 0.5) < 0.01
    a = gc.fast_bits(np.random.default_rng(3), 1000, 0.1)
    assert np.array_equal(a, gc.fast_bits(np.random.default_rng(3), 1000, 0.1))


if __name__ == "__main__":
    run_tests(globals())
