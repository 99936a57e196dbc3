#!/usr/bin/env python3
"""llama.cpp's own matmul, RoPE and SwiGLU, through ctypes on the libggml that llama-cpp-python ships.

The reference side of tests/python/test_matmul_sweep.py: ggml_mul_mat on the CPU backend, with
the weight in llama.cpp's repacked buffer type ("CPU_REPACK") wherever llama.cpp puts it there
(x86: Q4_0 and Q4_K matrices with rows % 8 == 0, Q2_K ones too in builds with AVX-512), so the
kernel that runs is the one llama.cpp runs for a model's matrix of that shape and a batch of that
many rows. ggml_rope_ext likewise.

One library per process (the SONAMEs are the same): `GgmlRef(lib_dir)` loads libggml-base,
libggml-cpu and libggml from `lib_dir`, by default the venv's llama_cpp/lib (-march=native on
this machine); bench/llamacpp/build_avx2_lib.sh builds an AVX2-only set. Run as a script it
serves requests for a parent process that holds another set (see `main`).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q5_0": 6, "q8_0": 8, "q2_K": 10, "q3_K": 11,
              "q4_K": 12, "q5_K": 13, "q6_K": 14, "bf16": 30}
# (elements, bytes) per block.
BLOCKS = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q4_0": (32, 18), "q5_0": (32, 22),
          "q8_0": (32, 34), "q2_K": (256, 84), "q3_K": (256, 110), "q4_K": (256, 144),
          "q5_K": (256, 176), "q6_K": (256, 210)}


def venv_lib_dir() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("llama_cpp")
    return Path(spec.origin).parent / "lib"


def row_bytes(type_name: str, k: int) -> int:
    e, b = BLOCKS[type_name]
    return k // e * b


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class GgmlRef:
    def __init__(self, lib_dir: Path | None = None, threads: int = 2):
        d = Path(lib_dir) if lib_dir else venv_lib_dir()
        mode = ctypes.RTLD_GLOBAL
        self.base = ctypes.CDLL(str(d / "libggml-base.so"), mode=mode)
        self.cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=mode)
        self.ggml = ctypes.CDLL(str(d / "libggml.so"), mode=mode)
        self.lib_dir = d
        self.threads = threads
        P, I64, I, F, Z = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
        b, c = self.base, self.cpu
        self._sig(b.ggml_init, P, [_InitParams])
        self._sig(b.ggml_free, None, [P])
        self._sig(b.ggml_tensor_overhead, Z, [])
        self._sig(b.ggml_graph_overhead, Z, [])
        self._sig(b.ggml_new_tensor_1d, P, [P, I, I64])
        self._sig(b.ggml_new_tensor_2d, P, [P, I, I64, I64])
        self._sig(b.ggml_new_tensor_3d, P, [P, I, I64, I64, I64])
        self._sig(b.ggml_mul_mat, P, [P, P, P])
        self._sig(b.ggml_rope_ext, P, [P, P, P, P, I, I, I, F, F, F, F, F, F])
        self._sig(b.ggml_new_graph, P, [P])
        self._sig(b.ggml_build_forward_expand, None, [P, P])
        self._sig(b.ggml_quantize_chunk, Z, [I, P, P, I64, I64, I64, P])
        self._sig(b.ggml_backend_tensor_set, None, [P, P, Z, Z])
        self._sig(b.ggml_backend_tensor_get, None, [P, P, Z, Z])
        self._sig(b.ggml_backend_buft_name, ctypes.c_char_p, [P])
        self._sig(b.ggml_backend_buffer_free, None, [P])
        self._sig(b.ggml_backend_alloc_ctx_tensors_from_buft, P, [P, P])
        self._sig(b.ggml_backend_graph_compute, I, [P, P])
        self._sig(b.ggml_backend_free, None, [P])
        self._sig(b.ggml_backend_get_device, P, [P])
        self._sig(b.ggml_backend_dev_backend_reg, P, [P])
        self._sig(b.ggml_backend_reg_get_proc_address, P, [P, ctypes.c_char_p])
        self._sig(c.ggml_backend_cpu_init, P, [])
        self._sig(c.ggml_backend_cpu_set_n_threads, None, [P, I])
        self._sig(c.ggml_backend_cpu_buffer_type if hasattr(c, "ggml_backend_cpu_buffer_type")
                  else b.ggml_backend_cpu_buffer_type, P, [])
        self._sig(c.ggml_cpu_has_avx512, I, [])
        self._sig(c.ggml_vec_swiglu_f32, None, [I, P, P, P])
        self._sig(c.ggml_cpu_has_avx2, I, [])
        self.backend = c.ggml_backend_cpu_init()
        c.ggml_backend_cpu_set_n_threads(self.backend, threads)
        dev = b.ggml_backend_get_device(self.backend)
        reg = b.ggml_backend_dev_backend_reg(dev)
        fn = b.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        self.repack_buft = None
        if fn:
            bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(dev)
            i = 0
            while bufts and bufts[i]:
                if b.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
                    self.repack_buft = bufts[i]
                i += 1
        cpu_buft = getattr(c, "ggml_backend_cpu_buffer_type", None) or b.ggml_backend_cpu_buffer_type
        self.cpu_buft = cpu_buft()
        self.avx512 = bool(c.ggml_cpu_has_avx512())

    @staticmethod
    def _sig(fn, res, args):
        fn.restype = res
        fn.argtypes = args

    def repacked(self, type_name: str, m: int) -> bool:
        """Whether llama.cpp puts an M-row matrix of this type in the repacked buffer on x86
        (ggml_repack_get_optimal_repack_type)."""
        if self.repack_buft is None or m % 8:
            return False
        return type_name in ("q4_0", "q4_K") or (type_name == "q2_K" and self.avx512)

    def quantize(self, type_name: str, w: np.ndarray) -> bytes:
        """ggml's own quantization (reference, no importance matrix) of F32 rows [m, k]."""
        w = np.ascontiguousarray(w, dtype=np.float32)
        m, k = w.shape
        if type_name == "f32":
            return w.tobytes()
        out = ctypes.create_string_buffer(row_bytes(type_name, k) * m)
        self.base.ggml_quantize_chunk(GGML_TYPES[type_name], w.ctypes.data, out, 0, m, k, None)
        return out.raw

    def _ctx(self, n_tensors: int):
        size = n_tensors * self.base.ggml_tensor_overhead() + self.base.ggml_graph_overhead() + 4096
        return self.base.ggml_init(_InitParams(size, None, True))

    def _compute(self, ctx, out, inputs: list[tuple[int, np.ndarray]], out_shape) -> np.ndarray:
        b = self.base
        gf = b.ggml_new_graph(ctx)
        b.ggml_build_forward_expand(gf, out)
        buf = b.ggml_backend_alloc_ctx_tensors_from_buft(ctx, self.cpu_buft)
        assert buf, "ggml_backend_alloc_ctx_tensors_from_buft failed"
        try:
            for t, a in inputs:
                a = np.ascontiguousarray(a)
                b.ggml_backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)
            assert b.ggml_backend_graph_compute(self.backend, gf) == 0
            y = np.empty(out_shape, dtype=np.float32)
            b.ggml_backend_tensor_get(out, y.ctypes.data, 0, y.nbytes)
            return y
        finally:
            b.ggml_backend_buffer_free(buf)

    def mul_mat(self, type_name: str, w_bytes: bytes, k: int, m: int, x: np.ndarray) -> np.ndarray:
        """y[n, m] = x[n, k] . w[m, k]^T as ggml_mul_mat computes it in one batch of n rows."""
        b = self.base
        x = np.ascontiguousarray(x, dtype=np.float32)
        n = x.shape[0]
        assert x.shape[1] == k and len(w_bytes) == row_bytes(type_name, k) * m
        ctx_w = self._ctx(1)
        w = b.ggml_new_tensor_2d(ctx_w, GGML_TYPES[type_name], k, m)
        buft = self.repack_buft if self.repacked(type_name, m) else self.cpu_buft
        wbuf = b.ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, buft)
        assert wbuf
        try:
            wb = ctypes.create_string_buffer(w_bytes, len(w_bytes))
            b.ggml_backend_tensor_set(w, wb, 0, len(w_bytes))
            ctx = self._ctx(4)
            try:
                xt = b.ggml_new_tensor_2d(ctx, 0, k, n)
                y = b.ggml_mul_mat(ctx, w, xt)
                return self._compute(ctx, y, [(xt, x)], (n, m))
            finally:
                b.ggml_free(ctx)
        finally:
            b.ggml_backend_buffer_free(wbuf)
            b.ggml_free(ctx_w)

    def swiglu(self, g: np.ndarray, u: np.ndarray) -> np.ndarray:
        """ggml_vec_swiglu_f32 (what GGML_OP_GLU's swiglu runs) row by row: g / (1 + e^-g) * u."""
        g = np.ascontiguousarray(g, dtype=np.float32)
        u = np.ascontiguousarray(u, dtype=np.float32)
        y = np.empty_like(g)
        for r in range(g.shape[0]):
            self.cpu.ggml_vec_swiglu_f32(g.shape[1], y[r].ctypes.data, g[r].ctypes.data,
                                         u[r].ctypes.data)
        return y

    def rope(self, x: np.ndarray, neox: bool, base: float = 10000.0) -> np.ndarray:
        """ggml_rope_ext on x [n_tokens, n_heads, head_dim] at positions 0..n_tokens-1, every
        dimension rotating, no scaling (as llama.cpp's graph calls it for a plain model)."""
        b = self.base
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, h, d = x.shape
        ctx = self._ctx(4)
        try:
            xt = b.ggml_new_tensor_3d(ctx, 0, d, h, n)
            pt = b.ggml_new_tensor_1d(ctx, 26, n)  # GGML_TYPE_I32
            y = b.ggml_rope_ext(ctx, xt, pt, None, d, 2 if neox else 0, 0, base, 1.0, 0.0, 1.0,
                                32.0, 1.0)
            return self._compute(ctx, y, [(xt, x), (pt, np.arange(n, dtype=np.int32))], (n, h, d))
        finally:
            b.ggml_free(ctx)


def main() -> int:
    """Serves one JSON request per stdin line, for a parent holding another libggml:
    {"op": "mul_mat", "type", "k", "m", "w": path, "x": path, "y": path} or
    {"op": "rope", "neox", "x": path, "shape": [n, h, d], "y": path},
    {"op": "swiglu", "x": path (gate rows then up rows), "shape": [rows, cols], "y": path} or
    {"op": "quantize", "type", "k", "m", "x": path, "y": path}; answers {"ok": true} or
    {"error": text}. argv[1]: the lib folder (default: the venv's)."""
    ref = GgmlRef(Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None)
    print(json.dumps({"ready": True, "avx512": ref.avx512, "lib": str(ref.lib_dir)}), flush=True)
    for line in sys.stdin:
        try:
            r = json.loads(line)
            if r["op"] == "mul_mat":
                x = np.fromfile(r["x"], dtype=np.float32).reshape(-1, r["k"])
                y = ref.mul_mat(r["type"], Path(r["w"]).read_bytes(), r["k"], r["m"], x)
            elif r["op"] == "quantize":
                w = np.fromfile(r["x"], dtype=np.float32).reshape(r["m"], r["k"])
                Path(r["y"]).write_bytes(ref.quantize(r["type"], w))
                print(json.dumps({"ok": True}), flush=True)
                continue
            elif r["op"] == "swiglu":
                rows, cols = r["shape"]
                x = np.fromfile(r["x"], dtype=np.float32).reshape(2, rows, cols)
                y = ref.swiglu(x[0], x[1])
            else:
                x = np.fromfile(r["x"], dtype=np.float32).reshape(r["shape"])
                y = ref.rope(x, r["neox"])
            y.tofile(r["y"])
            print(json.dumps({"ok": True}), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            print(json.dumps({"error": repr(e)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
