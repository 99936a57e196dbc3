"""pdctl as a user meets it: help, errors on bad input, reproducible sampling, stop strings,
tokenization and the figures printed on stderr."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def run(pdctl: Path, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    p = subprocess.run([str(pdctl), *args], capture_output=True, timeout=120)
    if check and p.returncode != 0:
        raise AssertionError(f"pdctl {' '.join(args)} failed ({p.returncode}):\n"
                             f"{p.stderr.decode(errors='replace')}")
    return p


def test_help_lists_subcommands(pdctl):
    p = run(pdctl, "--help", check=True)
    out = p.stdout.decode()
    for sub in ("generate", "tokenize", "logits"):
        assert sub in out
    g = run(pdctl, "generate", "--help", check=True).stdout.decode()
    for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--seed",
                 "--stop", "--threads", "--ignore-eos", "-n,--n-predict"):
        assert flag in g, flag


def test_bad_flags_exit_2_with_the_reason(pdctl):
    # Whatever CLI11's error kind (an unknown flag, a missing value, two exclusive flags, a value
    # outside its set), pdctl exits 2 and says why; --help exits 0.
    for args, why in ((("bench", "--bogus"), b"--bogus"),
                      (("generate", "-n"), b"n-predict"),
                      (("up", "--pin-cores", "--prefill-idle"), b"excludes"),
                      (("up", "--backend", "tpu"), b"tpu")):
        p = run(pdctl, *args)
        assert p.returncode == 2, (args, p.returncode, p.stderr)
        assert why in p.stderr, (args, p.stderr)
    assert run(pdctl, "up", "--help").returncode == 0


def test_missing_model_is_a_clear_error(pdctl, tmp_path):
    p = run(pdctl, "generate", "-m", str(tmp_path / "nope.gguf"), "-p", "hi")
    assert p.returncode != 0
    assert b"cannot open" in p.stderr and b"nope.gguf" in p.stderr


def test_truncated_model_is_a_clear_error(pdctl, synth_model, tmp_path):
    data = synth_model("llama2_f32").read_bytes()
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data[: len(data) // 2])
    p = run(pdctl, "generate", "-m", str(bad), "-p", "hi", "-n", "4")
    assert p.returncode != 0
    assert b"truncated" in p.stderr or b"outside" in p.stderr, p.stderr


def test_not_a_gguf_is_a_clear_error(pdctl, tmp_path):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, this is not a model\n")
    p = run(pdctl, "tokenize", "-m", str(bad), "--text", "x")
    assert p.returncode != 0
    assert b"not a GGUF file" in p.stderr


def test_prompt_longer_than_context_is_refused(pdctl, synth_model):
    p = run(pdctl, "generate", "-m", str(synth_model("llama2_f32")), "--prompt-ids",
            " ".join(["5"] * 40), "-n", "30", "--ctx", "64")
    assert p.returncode != 0
    assert b"exceeds the KV cache capacity" in p.stderr


def test_seeded_sampling_is_reproducible_and_reports_figures(pdctl, synth_model):
    m = str(synth_model("llama2_f32"))
    args = ("generate", "-m", m, "-p", "The quick brown fox", "-n", "24", "--temperature", "1.0",
            "--top-k", "0", "--top-p", "1", "--min-p", "0", "--ignore-eos")
    a = run(pdctl, *args, "--seed", "7", check=True)
    b = run(pdctl, *args, "--seed", "7", check=True)
    c = run(pdctl, *args, "--seed", "8", check=True)
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout
    err = a.stderr.decode()
    for what in ("prompt:", "decode:", "tokens/s", "peak memory", "seed: 7"):
        assert what in err, err


def test_stop_string_cuts_the_output(pdctl, synth_model):
    m = str(synth_model("llama2_f32"))
    args = ("generate", "-m", m, "-p", "Once", "-n", "40", "--temperature", "0", "--ignore-eos")
    full = run(pdctl, *args, check=True).stdout.decode()
    text = full.rstrip("\n")
    assert len(text) > 20
    stop = text[10:14]
    cut = run(pdctl, *args, "--stop", stop, check=True).stdout.decode().rstrip("\n")
    assert cut == text[: text.find(stop)]


def test_tokenize_matches_llamacpp_test_vectors(pdctl, repo_root):
    base = repo_root / "testdata" / "tokenizer" / "ggml-vocab-llama-spm.gguf"
    cases = base.with_suffix(".gguf.inp").read_text().split("\n__ggml_vocab_test__\n")
    expected = base.with_suffix(".gguf.out").read_text().split("\n")
    checked = 0
    for text, ids in zip(cases, expected):
        if not text.strip() or "\n" in text:
            continue
        p = run(pdctl, "tokenize", "-m", str(base), "--no-special", "--text", text, check=True)
        assert p.stdout.decode().split() == ids.split(), text
        checked += 1
    assert checked >= 10
    with_bos = run(pdctl, "tokenize", "-m", str(base), "--text", "Hello", check=True)
    assert with_bos.stdout.decode().split()[0] == "1"  # BOS added without --no-special


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_cpu_isa_cap_picks_the_kernel_set(pdctl, synth_model):
    """PDSERVE_CPU_ISA caps the CPU backend's kernels for the whole process (the dispatchers cache
    their choice in statics, hence one process per value): `pdctl bench` names the set that ran.
    A bad value is an error at startup, not a silent default."""
    import json
    import os

    model = str(synth_model("llama2_f32"))
    flags = _cpu_flags()
    has_avx2 = {"avx2", "fma", "f16c"} <= flags
    has_zmm = {"avx512f", "avx512dq"} <= flags
    vnni = {"avx512f", "avx512vl", "avx512_vnni", "avx512bw"} <= flags
    # AMX-INT8 on top (Linux grants the tile state on request since 5.16).
    amx = vnni and {"amx_tile", "amx_int8"} <= flags
    best = (("avx512-vnni-amx" if amx else "avx512-vnni") if vnni else "avx512") if has_zmm else (
        "avx2" if has_avx2 else "scalar")
    want = {"": best, "avx512": best, "avx2": "avx2" if has_avx2 else "scalar",
            "scalar": "scalar"}
    for value, expected in want.items():
        env = dict(os.environ, PDSERVE_CPU_ISA=value)
        env.pop("PDSERVE_CPU_NO_VNNI", None)
        env.pop("PDSERVE_CPU_NO_AMX", None)
        p = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "2", "-r", "1",
                            "-t", "2"], capture_output=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        assert json.loads(p.stdout)["kernels"] == expected, (value, p.stdout[:200])
    if has_zmm:  # the narrower switch: AVX-512 stays, the VNNI tiles go
        env = dict(os.environ, PDSERVE_CPU_NO_VNNI="1")
        env.pop("PDSERVE_CPU_ISA", None)
        p = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "2", "-r", "1",
                            "-t", "2"], capture_output=True, timeout=120, env=env)
        assert p.returncode == 0 and json.loads(p.stdout)["kernels"] == "avx512"
    if amx:  # narrower still: the VNNI tiles stay, the AMX kernels go
        env = dict(os.environ, PDSERVE_CPU_NO_AMX="1")
        env.pop("PDSERVE_CPU_ISA", None)
        env.pop("PDSERVE_CPU_NO_VNNI", None)
        p = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "2", "-r", "1",
                            "-t", "2"], capture_output=True, timeout=120, env=env)
        assert p.returncode == 0 and json.loads(p.stdout)["kernels"] == "avx512-vnni"
    bad = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "2", "-r", "1"],
                         capture_output=True, timeout=120,
                         env=dict(os.environ, PDSERVE_CPU_ISA="avx3"))
    assert bad.returncode != 0
    assert b"PDSERVE_CPU_ISA='avx3': expected avx512, avx2 or scalar" in bad.stderr


def test_bench_batched_after_prompt(pdctl, synth_model):
    """`pdctl bench --batch B --batch-pp P` times B sequences that each hold a P-token prompt
    (llama-batched-bench's -npp), B = 1 included; more than the cache holds is refused (exit 2)
    with the numbers, not run short."""
    import json

    model = str(synth_model("llama2_f32"))
    for b in (1, 3):
        p = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "3", "-r", "2",
                            "-t", "2", "--batch", str(b), "--batch-pp", "20"],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        d = json.loads(p.stdout)
        assert (d["batch"], d["batch_pp"]) == (b, 20)
        assert len(d["tg_batch_tok_s"]) == 2 and min(d["tg_batch_tok_s"]) > 0
    p = subprocess.run([str(pdctl), "bench", "-m", model, "--pp", "8", "--tg", "3", "-r", "1",
                        "--ctx", "64", "--batch", "4", "--batch-pp", "60"],
                       capture_output=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert b"(--batch-pp + --tg) need" in p.stderr, p.stderr


def test_synth_model_then_plan(pdctl, tmp_path):
    """`pdctl synth-model` writes a model pdctl runs; `pdctl plan` places it for a GPU budget,
    refuses what cannot fit (exit 1) and bad sizes (exit 2)."""
    model = tmp_path / "tiny.gguf"
    run(pdctl, "synth-model", "--shape", "tiny", "--type", "q8_0", str(model), check=True)
    gen = run(pdctl, "generate", "-m", str(model), "-p", "hello", "-n", "4", "-t", "1",
              check=True)
    assert gen.returncode == 0
    # No GPU here: the GPU bandwidth is given, the CPU's measured (or cached).
    big = run(pdctl, "plan", "-m", str(model), "--gpu-mem", "4G", "--gpu-bw", "3000",
              "--cpu-bw", "40", "--ctx", "256", check=True).stdout.decode()
    assert "every layer on the GPU" in big, big
    assert "predicted decode time per token" in big
    for t in ("q2_K", "q3_K", "q4_0", "q4_K", "q5_0", "q5_K", "q6_K", "q8_0", "f16"):
        assert f"\n{t} " in big, t
    # Exactly one layer fits: the budget of `--gpu-layers 1` as printed, rounded up.
    fixed = run(pdctl, "plan", "-m", str(model), "--gpu-mem", "4G", "--gpu-bw", "3000",
                "--cpu-bw", "40", "--ctx", "256", "--gpu-layers", "1", check=True).stdout.decode()
    assert "on the GPU (1 of" in fixed, fixed
    tiny = run(pdctl, "plan", "-m", str(model), "--gpu-mem", "1M", "--gpu-bw", "3000",
               "--cpu-bw", "40", "--ctx", "256")
    assert tiny.returncode == 1, tiny.stdout
    assert b"nothing fits" in tiny.stdout
    kv = run(pdctl, "plan", "-m", str(model), "--gpu-mem", "1M", "--gpu-bw", "3000",
             "--cpu-bw", "40", "--ctx", "100000", "--batch", "64")
    assert kv.returncode == 1 and b"KV cache of one layer" in kv.stdout, kv.stdout
    bad = run(pdctl, "plan", "-m", str(model), "--gpu-mem", "lots")
    assert bad.returncode == 2 and b"not a size" in bad.stderr
