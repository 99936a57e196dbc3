#!/usr/bin/env python3
"""Writes testdata/kquants: blocks produced by llama.cpp and their dequantization by the `gguf`
package, which tests/engine/quant/k_quants_test.cc compares with our DequantizeRow bit for bit.

Run from the repository root with the project's virtual environment:
    .venv/bin/python scripts/make_kquant_reference.py

Files (little-endian, raw):
  input.f32        N_INPUT = 112 * 256 float32 values: varied synthetic weights (gaussian rows of
                   several scales, heavy tails, outliers, all-zero, constant, one-hot, all-positive,
                   all-negative, tiny (f16-subnormal scales) and large values, sub-blocks of very
                   different scales).
  <type>.bin       the blocks of <type> for input.f32 as llama.cpp quantizes it
                   (ggml_quantize_chunk without an importance matrix; for q8_K the CPU backend's
                   activation quantizer), followed by N_RANDOM = 64 * 256 weights' worth of blocks
                   of random bytes (every bit pattern; f16/f32 scale fields kept finite).
  <type>.f32       the dequantization of every block of <type>.bin by gguf.quants.dequantize
                   (q8_K, which the gguf package lacks: ggml's dequantize_row_q8_K).
Types: q4_0 q8_0 q2_K q3_K q4_K q5_K q6_K q8_K.

The gguf package's numpy dequantizers are checked against ggml's own (to_float) on every file;
the script fails if they disagree in any bit.
"""

import ctypes
import os
import sys

import numpy as np

import gguf
import llama_cpp

N_INPUT = 112 * 256
N_RANDOM = 64 * 256
OUT_DIR = os.path.join("testdata", "kquants")

# name -> (ggml type number, weights per block, bytes per block, offsets of f16 scale fields)
TYPES = {
    "q4_0": (2, 32, 18, [0]),
    "q8_0": (8, 32, 34, [0]),
    "q2_K": (10, 256, 84, [80, 82]),
    "q3_K": (11, 256, 110, [108]),
    "q4_K": (12, 256, 144, [0, 2]),
    "q5_K": (13, 256, 176, [0, 2]),
    "q6_K": (14, 256, 210, [208]),
    "q8_K": (15, 256, 292, []),  # f32 d at 0, handled separately
}


class TypeTraits(ctypes.Structure):  # ggml.h: struct ggml_type_traits
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


class TypeTraitsCpu(ctypes.Structure):  # ggml-cpu.h: struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def load_ggml():
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    base.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_void_p]
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    return base, cpu


def make_input(rng):
    """N_INPUT values in super-blocks of 256 with varied shapes (one kind per super-block)."""
    blocks = []
    def add(v):
        v = np.asarray(v, dtype=np.float32)
        assert v.shape == (256,)
        blocks.append(v)
    # Real-ish weights: gaussian at scales typical of LLM matrices (and well beyond).
    for s in [0.02] * 24 + [0.005, 0.1, 0.5, 1.0, 3.0, 10.0, 100.0, 1000.0]:
        add(rng.standard_normal(256) * s)
    # Gaussian rows whose sub-blocks of 16 have very different scales.
    for _ in range(8):
        add(rng.standard_normal(256) * np.repeat(10.0 ** rng.uniform(-3, 0, 16), 16))
    # Heavy tails and outliers.
    for _ in range(8):
        add(rng.laplace(size=256) * 0.03)
    for _ in range(8):
        v = rng.standard_normal(256) * 0.02
        idx = rng.choice(256, size=3, replace=False)
        v[idx] = rng.choice([-1, 1], size=3) * rng.uniform(0.3, 1.0, size=3)
        add(v)
    for _ in range(4):
        add(rng.standard_t(2, size=256) * 0.05)
    # Uniform, all-positive, all-negative, positive with offset (Q*_K mins).
    for _ in range(4):
        add(rng.uniform(-1, 1, 256))
    for _ in range(4):
        add(rng.uniform(0.1, 1, 256))
    for _ in range(4):
        add(-rng.uniform(0.1, 1, 256))
    for _ in range(4):
        add(rng.standard_normal(256) * 0.1 + 0.5)
    # Extremes.
    add(np.zeros(256))
    add(np.full(256, 0.25))
    add(np.full(256, -3.0))
    one_hot = np.zeros(256)
    one_hot[77] = 1.5
    add(one_hot)
    one_hot = np.zeros(256)
    one_hot[200] = -0.7
    add(one_hot)
    add(np.where(np.arange(256) % 2 == 0, 1.0, -1.0))
    add(np.tile(np.linspace(-1, 1, 16), 16))
    add(rng.standard_normal(256) * 1e-6)   # scales in f16's subnormal range
    add(rng.standard_normal(256) * 1e-9)   # scales that underflow f16
    add(rng.standard_normal(256) * 2e4)    # large (Q8_0/Q4_0 scales near the f16 limit)
    # Sparse: most weights zero.
    for _ in range(4):
        v = np.zeros(256)
        idx = rng.choice(256, size=20, replace=False)
        v[idx] = rng.standard_normal(20)
        add(v)
    # Half the super-block zero, half gaussian; and a ramp.
    v = rng.standard_normal(256) * 0.05
    v[:128] = 0
    add(v)
    add(np.linspace(-2, 3, 256))
    while len(blocks) < N_INPUT // 256:
        add(rng.standard_normal(256) * 10.0 ** rng.uniform(-3, 1))
    x = np.concatenate(blocks).astype(np.float32)
    assert x.size == N_INPUT, x.size
    return x


def random_blocks(rng, name):
    """Random bytes for N_RANDOM weights of `name`, with finite scale fields."""
    _, bs, bb, f16_offsets = TYPES[name]
    nb = N_RANDOM // bs
    raw = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off in f16_offsets:
        h = raw[:, off:off + 2].copy().view(np.uint16).reshape(nb)
        # Keep finite: an exponent of 31 (inf/NaN) becomes 30. Also bias towards useful scales:
        # exponents 0..30 uniformly, so subnormals, tiny and huge scales all appear.
        exp = (h >> 10) & 0x1F
        h = np.where(exp == 0x1F, h & ~np.uint16(0x0400), h).astype(np.uint16)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nb, 2)
    if name == "q8_K":
        d = (rng.uniform(-1, 1, nb) * 10.0 ** rng.uniform(-8, 3, nb)).astype(np.float32)
        raw[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
        # bsums are not read by the dequantizer but keep them consistent with qs anyway.
        qs = raw[:, 4:260].view(np.int8).astype(np.int32)
        bsums = qs.reshape(nb, 16, 16).sum(axis=2).astype(np.int16)
        raw[:, 260:292] = bsums.view(np.uint8).reshape(nb, 32)
    return raw.reshape(-1)


def quantize(base, cpu, name, x):
    ggml_type, bs, bb, _ = TYPES[name]
    n = x.size
    out = np.zeros(n // bs * bb, dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if name == "q8_K":
        fn = ROW_FN(cpu.ggml_get_type_traits_cpu(ggml_type).contents.from_float)
        fn(x.ctypes.data, out.ctypes.data, n)
    else:
        rows = n // 256
        written = base.ggml_quantize_chunk(ggml_type, x.ctypes.data, out.ctypes.data, 0, rows,
                                           256, None)
        assert written == out.size, (name, written, out.size)
    return out


def ggml_dequantize(base, name, raw):
    ggml_type, bs, bb, _ = TYPES[name]
    n = raw.size // bb * bs
    y = np.zeros(n, dtype=np.float32)
    raw = np.ascontiguousarray(raw)
    if name == "q8_K":
        base.dequantize_row_q8_K.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        base.dequantize_row_q8_K(raw.ctypes.data, y.ctypes.data, n)
    else:
        fn = ROW_FN(base.ggml_get_type_traits(ggml_type).contents.to_float)
        fn(raw.ctypes.data, y.ctypes.data, n)
    return y


def main():
    base, cpu = load_ggml()
    rng = np.random.default_rng(20240607)
    x = make_input(rng)
    os.makedirs(OUT_DIR, exist_ok=True)
    x.tofile(os.path.join(OUT_DIR, "input.f32"))
    total = x.nbytes
    ok = True
    for name, (ggml_type, bs, bb, _) in TYPES.items():
        tt = base.ggml_get_type_traits(ggml_type).contents
        assert (tt.blck_size, tt.type_size) == (bs, bb), (name, tt.blck_size, tt.type_size)
        raw = np.concatenate([quantize(base, cpu, name, x), random_blocks(rng, name)])
        if name == "q8_K":
            y = ggml_dequantize(base, name, raw)
        else:
            qtype = gguf.GGMLQuantizationType(ggml_type)
            y = gguf.quants.dequantize(raw.reshape(-1, bb), qtype).reshape(-1).astype(np.float32)
        y_ggml = ggml_dequantize(base, name, raw)
        diff = np.count_nonzero(y.view(np.uint32) != y_ggml.view(np.uint32))
        if diff:
            ok = False
        assert np.all(np.isfinite(y)), name
        raw.tofile(os.path.join(OUT_DIR, f"{name}.bin"))
        y.tofile(os.path.join(OUT_DIR, f"{name}.f32"))
        total += raw.nbytes + y.nbytes
        print(f"{name}: {raw.size // bb} blocks ({N_INPUT // bs} from input.f32), "
              f"gguf vs ggml dequantization: {diff} differing floats")
    print(f"wrote {OUT_DIR}: {total} bytes")
    if not ok:
        sys.exit("the gguf package and ggml disagree; see above")


if __name__ == "__main__":
    main()
