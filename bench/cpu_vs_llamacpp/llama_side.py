"""llama.cpp's side of bench/cpu_vs_llamacpp/run.py: one thread count, one process.

Times, through llama-cpp-python, what `pdctl bench` times in pdserve: the model load, the first
forward after it (an 8-token prompt), pp (one eval of a PP-token prompt from an empty cache) and
tg (TG single-token evals from an empty cache). Token ids are the same synthetic ids as pdctl
bench's (BOS, then bench_token(i)). Rates come from llama.cpp's own counters
(llama_perf_context: t_p_eval_ms / t_eval_ms, the figures llama-bench reports), so Python's
per-call overhead is not charged to llama.cpp; the wall-clock rates are printed beside them.
Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import resource
import time


def bench_token(i: int) -> int:
    return 2 if i == 0 else 1000 + (i * 7919) % 100000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096)
    args = ap.parse_args()

    rss_python_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import llama_cpp  # noqa: E402  (after the baseline RSS reading)
    from llama_cpp import Llama

    rss_import_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    llm = Llama(model_path=args.model, n_ctx=args.ctx, n_batch=args.pp, n_ubatch=args.pp,
                n_threads=args.threads, n_threads_batch=args.threads,
                type_k=llama_cpp.GGML_TYPE_F16, type_v=llama_cpp.GGML_TYPE_F16,
                flash_attn=False, use_mmap=True, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    ctx = llm.ctx
    toks = [bench_token(i) for i in range(max(args.pp, args.tg))]

    def prompt(n: int) -> None:
        llm.reset()
        llm.eval(toks[:n])
        llama_cpp.llama_synchronize(llm.ctx)  # perf counters are updated here

    def decode(n: int) -> None:
        llm.reset()
        for i in range(n):
            llm.eval([toks[i]])
            llama_cpp.llama_synchronize(llm.ctx)

    t1 = time.perf_counter()
    prompt(8)
    first_s = time.perf_counter() - t1
    prompt(args.pp)
    decode(min(args.tg, 16))

    pp_rates, tg_rates, pp_wall, tg_wall = [], [], [], []
    for _ in range(args.reps):
        llama_cpp.llama_perf_context_reset(ctx)
        t = time.perf_counter()
        prompt(args.pp)
        pp_wall.append(args.pp / (time.perf_counter() - t))
        perf = llama_cpp.llama_perf_context(ctx)
        pp_rates.append(1e3 * perf.n_p_eval / perf.t_p_eval_ms)
        llama_cpp.llama_perf_context_reset(ctx)
        t = time.perf_counter()
        decode(args.tg)
        tg_wall.append(args.tg / (time.perf_counter() - t))
        perf = llama_cpp.llama_perf_context(ctx)
        # llama.cpp counts a 1-token batch as eval (n_eval), larger ones as prompt eval.
        n, ms = perf.n_eval + perf.n_p_eval, perf.t_eval_ms + perf.t_p_eval_ms
        tg_rates.append(1e3 * n / ms)

    print(json.dumps({
        "system": f"llama.cpp (llama-cpp-python {llama_cpp.__version__})",
        "model": args.model, "threads": args.threads, "kv_type": "f16", "pp": args.pp,
        "tg": args.tg, "load_s": load_s, "first_token_s": first_s, "pp_tok_s": pp_rates,
        "tg_tok_s": tg_rates, "pp_tok_s_wall": pp_wall, "tg_tok_s_wall": tg_wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_python_mib": rss_python_mib, "rss_after_import_mib": rss_import_mib,
    }))


if __name__ == "__main__":
    main()
