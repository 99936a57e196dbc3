"""`pdctl quantize` end to end on the synthetic models (scripts/synth_models.py).

  * every base type with round-to-nearest: the output loads in llama.cpp (llama-cpp-python) and
    its logits stay close to the full-precision model's (limits looser for fewer bits); all
    metadata is copied, the quantization keys are set, the tensors have the planned types; our
    engine runs the outputs whose types it has kernels for, matching llama.cpp on the same file;
  * the default policy on a model with a tied head and rows k-quants cannot take;
  * importance and GPTQ run end to end on the built-in calibration text, and GPTQ brings the
    quantized model closer to the original than round-to-nearest on the (disjoint) built-in
    evaluation text;
  * an untied token_embd under importance/GPTQ is weighed by the matrices that read the residual
    stream (recomputed here in NumPy), which lowers its error so weighed;
  * the built-in texts are the same bytes in pdctl and scripts/texts.py;
  * errors exit with 2 and leave neither OUT nor OUT.tmp behind.

The per-type tests keep token_embd and output at q8_0 (--override) so that they run in seconds:
the k-quant searches on the 32k-row embedding and head take most of a full run. One test runs the
full default policy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gguf

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

import kl_eval  # noqa: E402
import texts  # noqa: E402

TYPES = ["q8_0", "q6_K", "q5_K", "q4_K", "q4_0", "q3_K", "q2_K"]
# Limits on ||logits_q - logits_f|| / ||logits_f|| over a 64-token prompt through llama.cpp, for
# mistral_gqa_f16 with token_embd/output at q8_0 (measured values in the comments; random
# models amplify quantization noise layer by layer, hence the loose limits at low bit widths).
REL_L2_LIMIT = {"q8_0": 0.05, "q6_K": 0.08, "q5_K": 0.12, "q4_K": 0.2, "q4_0": 0.25,
                "q3_K": 0.4, "q2_K": 0.7}
FAST = ["--override", r"token_embd\.weight=q8_0", "--override", r"output\.weight=q8_0"]
MODEL = "mistral_gqa_f16"


def record(request, line: str) -> None:
    """Shows a measured value at the end of the run (conftest's `measurement`), or prints it."""
    try:
        request.getfixturevalue("measurement")(f"quantize: {line}")
    except pytest.FixtureLookupError:
        print(line)


def run(pdctl: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(pdctl), *map(str, args)], capture_output=True, timeout=timeout)


def quantize(pdctl: Path, src: Path, out: Path, *args: str) -> str:
    p = run(pdctl, "quantize", src, out, *args)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert out.is_file() and not Path(str(out) + ".tmp").exists()
    return p.stdout.decode()


def table_rows(report: str) -> dict[str, list[str]]:
    """tensor name -> columns of the per-tensor table."""
    rows = {}
    for line in report.splitlines()[1:]:
        if not line.strip():
            break
        cols = line.split()
        rows[cols[0]] = cols
    return rows


def prompt_ids(model: Path, n: int = 64) -> list[int]:
    import llama_cpp

    vocab = llama_cpp.Llama(str(model), vocab_only=True, verbose=False)
    text = texts.build_text("evaluation")[:4000]
    return [vocab.token_bos()] + vocab.tokenize(text, add_bos=False)[: n - 1]


def llama_logits(model: Path, ids: list[int]) -> np.ndarray:
    return kl_eval.model_logits(model, [ids], ctx=256, threads=2)[0]


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def fields(path: Path) -> dict[str, object]:
    """Metadata of a GGUF as comparable Python values (the gguf package's reader)."""
    r = gguf.GGUFReader(path)
    out = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = (tuple(int(t) for t in f.types), [bytes(f.parts[i].tobytes()) for i in f.data])
    return out


@pytest.fixture(scope="module")
def rtn_outputs(pdctl, synth_model, tmp_path_factory):
    """Base type -> (path, pdctl's report) of the model quantized with rtn, made on first use."""
    outdir = tmp_path_factory.mktemp("quantized")
    made: dict[str, tuple[Path, str]] = {}

    def get(t: str) -> tuple[Path, str]:
        if t not in made:
            out = outdir / f"{MODEL}-{t}.gguf"
            made[t] = (out, quantize(pdctl, synth_model(MODEL), out, "--type", t, *FAST))
        return made[t]

    return get


@pytest.fixture(scope="module")
def f32_logits(synth_model):
    src = synth_model(MODEL)
    ids = prompt_ids(src)
    return ids, llama_logits(src, ids)


@pytest.mark.parametrize("qtype", TYPES)
def test_rtn_every_type_loads_in_llama_cpp(qtype, rtn_outputs, f32_logits, synth_model, request):
    out, report = rtn_outputs(qtype)
    src = synth_model(MODEL)
    rows = table_rows(report)
    # Table: every tensor, with its type, bits per weight and relative error.
    assert set(rows) == {t.name for t in gguf.GGUFReader(src).tensors}
    q = rows["blk.1.attn_q.weight"]
    assert q[2] == qtype and float(q[3]) > 0 and 0 < float(q[4]) < 0.5 and q[6] == "rtn"
    assert rows["token_embd.weight"][2] == "q8_0" and "override" in " ".join(rows["output.weight"])
    assert "bits per weight" in report

    # Metadata copied byte for byte, quantization keys set.
    fin, fout = fields(src), fields(out)
    for key in fin:
        if key != "general.file_type":
            assert fout[key] == fin[key], key
    assert set(fout) - set(fin) == {"general.quantization_version"}
    r = gguf.GGUFReader(out)
    assert int(r.fields["general.quantization_version"].parts[-1][0]) == 2
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.1.attn_q.weight"].lower() == qtype.lower()
    for name in ("blk.0.attn_norm.weight", "output_norm.weight"):
        assert types[name] == "F32"

    # The gguf package (ggml's dequantizers, bit for bit) reads the weights pdctl meant to write:
    # its dequantization reproduces the error pdctl measured on its own.
    src_t = {t.name: t for t in gguf.GGUFReader(src).tensors}
    for t in r.tensors:
        if t.name not in ("blk.1.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight"):
            continue
        w = src_t[t.name].data.astype(np.float32).reshape(-1)
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
        err = float(np.linalg.norm(deq - w) / np.linalg.norm(w))
        assert abs(err - float(rows[t.name][4])) < 2e-5, (t.name, err, rows[t.name])

    ids, base = f32_logits
    got = llama_logits(out, ids)
    err = rel_l2(got, base)
    record(request, f"{MODEL} {qtype} rtn: llama.cpp logits rel_l2 vs the f16 model {err:.4f} "
                    f"(limit {REL_L2_LIMIT[qtype]})")
    assert err < REL_L2_LIMIT[qtype]


@pytest.mark.parametrize("qtype", TYPES)
def test_our_engine_runs_the_output(qtype, pdctl, rtn_outputs, f32_logits, tmp_path, request):
    """Our forward pass on the quantized file matches llama.cpp's on the same file (every type
    has CPU matmul kernels: an UNIMPLEMENTED from pdctl fails here).

    Both engines quantize the activations (Q8_0 / Q8_K) before the dot products with quantized
    weights, with small differences in rounding that this random model amplifies: on the F16
    input the two agree to ~5e-4, on its quantized versions to ~1.4e-2 for every type. A weight
    read wrongly would give differences of order 1."""
    out, _ = rtn_outputs(qtype)
    ids, _ = f32_logits
    dump = tmp_path / "logits.f32"
    p = run(pdctl, "logits", "-m", out, "--prompt-ids", " ".join(map(str, ids)), "-o", dump)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    ours = np.fromfile(dump, dtype=np.float32)
    theirs = llama_logits(out, ids)[-1]
    err = rel_l2(ours, theirs)
    record(request, f"{MODEL} {qtype}: pdserve vs llama.cpp logits on the same file, rel_l2 "
                    f"{err:.2e} (limit 3e-2)")
    assert err < 3e-2


def test_default_policy_with_tied_head_and_fallbacks(pdctl, synth_model, tmp_path, request):
    src = synth_model("llama3_gqa_f32")  # tied head, n_ff 704 (not a multiple of 256)
    out = tmp_path / "q4_K_M.gguf"
    report = quantize(pdctl, src, out, "--type", "q4_K")
    rows = table_rows(report)
    assert rows["token_embd.weight"][2] == "q6_K"  # the tied head, >= 6 bits under policy M
    assert rows["blk.0.attn_v.weight"][2] == "q5_K"
    assert rows["blk.1.attn_q.weight"][2] == "q4_K"
    down = " ".join(rows["blk.1.ffn_down.weight"])
    assert rows["blk.1.ffn_down.weight"][2] == "q5_0" and "needs rows of 256" in down
    assert rows["rope_freqs.weight"][2] == "f32" and rows["rope_freqs.weight"][6] == "copy"
    assert "file_type 15 (Q4_K_M)" in report
    r = gguf.GGUFReader(out)
    assert int(r.fields["general.file_type"].parts[-1][0]) == 15
    ids = prompt_ids(src)
    err = rel_l2(llama_logits(out, ids), llama_logits(src, ids))
    record(request, f"llama3_gqa_f32 q4_K policy M rtn: llama.cpp logits rel_l2 {err:.4f}")
    assert err < 0.5  # this variant is more sensitive to noise than mistral_gqa_f16 (~0.3)


def test_policies_trade_size_for_quality(pdctl, synth_model, tmp_path):
    src = synth_model(MODEL)
    sizes = {}
    for pol in ("S", "M", "L"):
        out = tmp_path / f"{pol}.gguf"
        quantize(pdctl, src, out, "--type", "q3_K", "--policy", pol, *FAST[:2])
        sizes[pol] = out.stat().st_size
    assert sizes["S"] < sizes["M"] < sizes["L"], sizes


def test_gptq_and_importance_with_the_builtin_text(pdctl, synth_model, tmp_path, request):
    src = synth_model(MODEL)
    outs = {}
    for method in ("rtn", "importance", "gptq"):
        out = tmp_path / f"{method}.gguf"
        p = run(pdctl, "quantize", src, out, "--type", "q3_K", "--method", method,
                "--calib-tokens", "4096", *FAST)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        report, progress = p.stdout.decode(), p.stderr.decode()
        rows = table_rows(report)
        if method != "rtn":
            assert "calibration: 4" in report and "built-in calibration text" in report
            # stderr is not a terminal here: plain progress lines, not a redrawn bar.
            assert "calibration: 100%" in progress and "\r" not in progress
            assert rows["blk.0.attn_q.weight"][6] == method
            assert float(rows["blk.0.attn_q.weight"][5].rstrip("~")) > 0  # x_err reported
        assert "quantizing: 100%" in progress
        outs[method] = out
    # On the evaluation text (disjoint from the calibration text), through llama.cpp.
    ev = texts.build_text("evaluation")
    import llama_cpp

    vocab = llama_cpp.Llama(str(src), vocab_only=True, verbose=False)
    ids = vocab.tokenize(ev, add_bos=False)
    chunks = [[vocab.token_bos()] + ids[i:i + 255] for i in range(0, 1020, 255)]
    base = kl_eval.model_logits(src, chunks, 256, 2)
    kl = {m: kl_eval.compare(base, kl_eval.model_logits(o, chunks, 256, 2), chunks)["kl"]
          for m, o in outs.items()}
    record(request, f"{MODEL} q3_K KL(f16 || quantized) on 1020 evaluation tokens: " +
           ", ".join(f"{m} {v:.4f}" for m, v in kl.items()))
    assert kl["gptq"] < 0.9 * kl["rtn"]
    assert kl["importance"] < 1.05 * kl["rtn"]


def residual_importance(src: Path) -> np.ndarray:
    """The column weights of an untied token_embd, computed here from the model's own tensors:
    sum over every matrix that reads the residual stream (after the norm g in front of it) of
    g_j^2 ||W[:, j]||^2, plus 1% of the mean as a floor (calibration.h, ResidualImportance)."""
    r = gguf.GGUFReader(src)
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
    n_embd = t["token_embd.weight"].shape[1]
    acc = np.zeros(n_embd)
    groups = [("output_norm.weight", ["output.weight"])]
    layer = 0
    while f"blk.{layer}.attn_norm.weight" in t:
        b = f"blk.{layer}."
        groups.append((b + "attn_norm.weight", [b + "attn_q.weight", b + "attn_k.weight",
                                                b + "attn_v.weight"]))
        groups.append((b + "ffn_norm.weight", [b + "ffn_gate.weight", b + "ffn_up.weight"]))
        layer += 1
    for norm, readers in groups:
        col_sq = sum((t[m] ** 2).sum(axis=0) for m in readers if m in t)
        acc += t[norm] ** 2 * col_sq
    return acc + 1e-2 * acc.mean()


def test_untied_embedding_is_weighed_by_the_residual_stream(pdctl, synth_model, tmp_path,
                                                            request):
    """A lookup table has no calibration inputs; its columns are weighed by what reads them."""
    src = synth_model(MODEL)  # untied head
    keep = ["--override", r"token_embd\.weight=q2_K", "--override", r"blk\..*=q8_0",
            "--override", r"output\.weight=q8_0"]
    a = residual_importance(src)
    emb = next(x for x in gguf.GGUFReader(src).tensors if x.name == "token_embd.weight")
    w = np.asarray(emb.data, dtype=np.float64)
    err, reports = {}, {}
    for method in ("rtn", "importance", "gptq"):
        out = tmp_path / f"{method}.gguf"
        reports[method] = table_rows(quantize(pdctl, src, out, "--type", "q2_K", "--method",
                                              method, "--calib-tokens", "512", *keep))
        q_t = next(x for x in gguf.GGUFReader(out).tensors if x.name == "token_embd.weight")
        assert q_t.tensor_type == gguf.GGMLQuantizationType.Q2_K
        q = gguf.quants.dequantize(q_t.data, q_t.tensor_type).astype(np.float64)
        err[method] = float(np.sqrt(((w - q) ** 2 * a).sum() / (w ** 2 * a).sum()))
    record(request, f"{MODEL} q2_K token_embd, error weighed by the residual stream: " +
           ", ".join(f"{m} {v:.5f}" for m, v in err.items()))
    assert reports["rtn"]["token_embd.weight"][6] == "rtn"
    for method in ("importance", "gptq"):
        row = reports[method]["token_embd.weight"]
        assert row[6] == "importance" and "residual" in " ".join(row[7:]), row
        # The reported x_err is this weighted error, and the weighing lowered it.
        assert float(row[5].rstrip("~")) == pytest.approx(err[method], rel=2e-3, abs=2e-5)
        assert err[method] < err["rtn"]


# (method, type, limit on pdserve vs llama.cpp on the same file, both with F32 KV and llama.cpp's
# golden settings, scripts/make_llama_reference.py). Q8_0: our kernels follow llama.cpp's
# summation orders, measured 0.
MOE_CASES = [("rtn", "q8_0", 1e-6), ("gptq", "q4_0", 1e-6)]


def llama_logits_f32_kv(model: Path, ids: list[int]) -> np.ndarray:
    """llama.cpp's last-position logits with the goldens' settings (F32 KV, no flash attention:
    the settings pdserve reproduces bit for bit)."""
    import llama_cpp
    import make_llama_reference

    llm = llama_cpp.Llama(str(model), verbose=False, **make_llama_reference.SETTINGS)
    try:
        llm.eval(ids)
        return np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
    finally:
        llm.close()


@pytest.mark.parametrize("method,qtype,limit", MOE_CASES)
def test_experts_are_quantized_and_the_router_kept(method, qtype, limit, pdctl, synth_model,
                                                   tmp_path, request):
    """A mixture of experts (qwen3moe_f32): the stacked expert tensors are quantized whole (each
    expert's rows are rows of the 3-D tensor; GPTQ's statistics of a stacked tensor gather the
    inputs of all its experts), the router stays F32 as llama.cpp's quantizer keeps it, llama.cpp
    loads the output, and our engine matches llama.cpp on it."""
    src = synth_model("qwen3moe_f32")
    out = tmp_path / f"moe-{method}.gguf"
    report = quantize(pdctl, src, out, "--type", qtype, "--method", method,
                      "--calib-tokens", "1024", *FAST)
    rows = table_rows(report)
    assert rows["blk.0.ffn_gate_exps.weight"][2] == qtype
    assert rows["blk.1.ffn_down_exps.weight"][6] == method
    r = gguf.GGUFReader(out)
    tensors = {t.name: t for t in r.tensors}
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        t = tensors[f"blk.1.{name}.weight"]
        assert t.tensor_type.name == qtype.upper()
        assert [int(d) for d in t.shape] == [
            int(d) for d in {t.name: t for t in gguf.GGUFReader(src).tensors}[t.name].shape]
    ids = prompt_ids(src, 40)
    dump = tmp_path / "logits.f32"
    p = run(pdctl, "logits", "-m", out, "--kv-type", "f32", "--prompt-ids",
            " ".join(map(str, ids)), "-o", dump)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    ours = np.fromfile(dump, dtype=np.float32)
    theirs = llama_logits_f32_kv(out, ids)
    base = llama_logits_f32_kv(src, ids)
    err, q_err = rel_l2(ours, theirs), rel_l2(theirs, base)
    record(request, f"qwen3moe_f32 {qtype} {method}: pdserve vs llama.cpp on the same file "
                    f"rel_l2 {err:.2e} (limit {limit:g}); llama.cpp quantized vs f32 {q_err:.3f}")
    assert err < limit


def test_calibration_from_a_file(pdctl, synth_model, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "imp.gguf"
    report = quantize(pdctl, synth_model("llama2_f32"), out, "--type", "q4_0", "--method",
                      "importance", "--calib", calib, "--chunk", "128")
    assert f"from {calib}" in report
    assert table_rows(report)["blk.0.ffn_up.weight"][6] == "importance"


def test_builtin_texts_match_python(pdctl, tmp_path):
    for kind in ("calibration", "evaluation"):
        out = tmp_path / kind
        p = run(pdctl, "texts", kind, "-o", out)
        assert p.returncode == 0, p.stderr
        assert out.read_bytes() == texts.build_text(kind)
    assert texts.main(["--check"]) == 0


def _vocab_only(repo_root: Path) -> Path:
    path = repo_root / "testdata" / "tokenizer" / "ggml-vocab-llama-spm.gguf"  # in the repo
    assert path.is_file(), path
    return path


@pytest.mark.parametrize("case", ["type", "method", "policy", "override", "input", "output",
                                  "cannot_run", "calib_file"])
def test_errors_exit_2_and_leave_nothing(case, pdctl, synth_model, tmp_path, repo_root):
    src = synth_model("llama2_f32")
    out = tmp_path / "out.gguf"
    args = {"type": ["--type", "q9_K"],
            "method": ["--type", "q4_K", "--method", "awq"],
            "policy": ["--type", "q4_K", "--policy", "XXL"],
            "override": ["--type", "q4_K", "--override", "blk.*"],
            "input": ["--type", "q4_K"],
            "output": ["--type", "q4_K"],
            "cannot_run": ["--type", "q4_K", "--method", "gptq"],
            "calib_file": ["--type", "q4_K", "--method", "gptq", "--calib",
                           tmp_path / "missing.txt"]}[case]
    if case == "input":
        src = tmp_path / "missing.gguf"
    if case == "output":
        out = tmp_path / "no" / "such" / "dir" / "out.gguf"
    if case == "cannot_run":
        src = _vocab_only(repo_root)  # metadata only: nothing our engine can run
    p = run(pdctl, "quantize", src, out, *args)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "pdctl quantize: error:" in err
    expect = {"type": "q9_K", "method": "awq", "policy": "XXL", "override": "REGEX=TYPE",
              "input": "missing.gguf", "output": "out.gguf.tmp",
              "cannot_run": "cannot run this model", "calib_file": "missing.txt"}[case]
    assert expect in err
    assert not out.exists() and not Path(str(out) + ".tmp").exists()
    assert list(tmp_path.glob("*.tmp")) == []
