"""pd-serve's OpenAI-compatible HTTP API, as the official `openai` Python client sees it.

One real pd-serve (frontend + scheduler + engine) serves a synthetic Llama (random weights, so the
text is gibberish, but every token goes through the real model) for the whole module, with an API
key and a 64 KiB body limit from a config file. Covered: models.list, chat and text completions
with and without streaming (usage chunk included), stop strings, seeds, request errors answered
with the right status and the field named while another stream runs on unharmed, API keys, a
client that disconnects mid-stream (its KV freed at once), /metrics checked by `promtool`, and a
real Prometheus server scraping pd-serve. A last test serves the default model (Gemma 3 270M) for
its chat template and real text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import httpx2
import openai
import pytest

READY = re.compile(r"^pd-serve ready: grpc=(\S+) http=(\S+) model=(\S+)$")
API_KEY = "sk-pdserve-test"
MAX_BODY = 65536
VARIANT = "llama2_f32"  # 2 layers, 128 wide: a token costs well under a millisecond


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, model: str):
        self.proc, self.url, self.model = proc, url, model
        self.stderr: list[str] = []

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return r.read().decode()

    def metric(self, name: str) -> float:
        """The value of one sample line `name value` (name may carry labels)."""
        for line in self.metrics().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{name} not in /metrics")


def _start(pd_serve_bin: Path, args: list[str]) -> Server:
    proc = subprocess.Popen(
        [str(pd_serve_bin), "--grpc-port", "0", "--http-port", "0", "--threads", "2",
         "--shutdown-grace", "1", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        m = READY.match(line.strip())
        if m:
            srv = Server(proc, m.group(2), m.group(3))
            # Drain stderr so that the server never blocks on a full pipe.
            threading.Thread(target=lambda: srv.stderr.extend(proc.stderr), daemon=True).start()
            return srv
    proc.kill()
    pytest.fail(f"pd-serve did not get ready: {proc.stderr.read()}")


def _stop(srv: Server) -> None:
    srv.proc.send_signal(signal.SIGTERM)
    try:
        assert srv.proc.wait(timeout=30) == 0, "".join(srv.stderr[-50:])
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


@pytest.fixture(scope="module")
def server(pd_serve_bin: Path, synth_model, tmp_path_factory) -> Server:
    cfg = tmp_path_factory.mktemp("serve") / "serve.yaml"
    cfg.write_text(f"api_keys: [{API_KEY}]\nlimits:\n  max_body_bytes: {MAX_BODY}\n"
                   "kv:\n  memory_mib: 64\n")
    srv = _start(pd_serve_bin, ["--config", str(cfg), "--model", str(synth_model(VARIANT))])
    yield srv
    _stop(srv)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_models_list(client: openai.OpenAI, server: Server):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [server.model] == [VARIANT]
    assert models.data[0].object == "model"
    assert models.data[0].owned_by == "pdserve"


def test_chat_completion(client: openai.OpenAI, server: Server):
    r = client.chat.completions.create(model=server.model, messages=user("Hello there"),
                                       max_tokens=12, temperature=0.7, seed=5)
    assert r.object == "chat.completion"
    assert r.model == server.model
    assert r.id.startswith("chatcmpl-")
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 2  # the template wraps the message
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if c.finish_reason == "length":
        assert r.usage.completion_tokens == 12
    # The same seed gives the same text; the request id differs.
    again = client.chat.completions.create(model=server.model, messages=user("Hello there"),
                                           max_tokens=12, temperature=0.7, seed=5)
    assert again.choices[0].message.content == c.message.content
    assert again.id != r.id


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI, server: Server):
    kwargs = dict(model=server.model, messages=[{"role": "system", "content": "Be brief."},
                                                *user("Tell me a story")],
                  max_tokens=24, temperature=0)
    full = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(**kwargs, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == full.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    # include_usage: a last chunk without choices carries the usage; the others carry none.
    assert chunks[-1].choices == []
    # The same usage, except that the second request found the first one's prompt blocks in the
    # prefix cache (the prompt is under 16 tokens here when the template is short: then none).
    streamed, whole = chunks[-1].usage.model_dump(), full.usage.model_dump()
    assert streamed.pop("prompt_tokens_details")["cached_tokens"] >= \
        whole.pop("prompt_tokens_details")["cached_tokens"]
    assert streamed == whole
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_streaming_and_stop(client: openai.OpenAI, server: Server):
    full = client.completions.create(model=server.model, prompt="Once upon a time",
                                     max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.object == "text_completion"
    assert full.id.startswith("cmpl-")
    text = full.choices[0].text
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 32

    chunks = list(client.completions.create(model=server.model, prompt="Once upon a time",
                                            max_tokens=32, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].text for ch in chunks) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chunks)  # no include_usage: no usage chunk

    # A stop string taken from the middle of the greedy text: generation ends before it.
    words = [w for w in text.split() if len(w) >= 3]
    assert words, text
    stop = words[len(words) // 2]
    cut = client.completions.create(model=server.model, prompt="Once upon a time",
                                    max_tokens=32, temperature=0, stop=[stop, "\u00a7never\u00a7"],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


def test_extensions_shared_with_grpc(client: openai.OpenAI, server: Server):
    """request_id, ignore_eos, top_k / min_p / repetition_penalty and token ids, as in gRPC."""
    chunks = list(client.chat.completions.create(
        model=server.model, messages=user("Count"), max_tokens=20, temperature=0.9, seed=3,
        stream=True, stream_options={"include_usage": True, "include_token_ids": True},
        extra_body={"request_id": "my-request-7", "ignore_eos": True, "top_k": 5, "min_p": 0.01,
                    "repetition_penalty": 1.2, "priority": 2}))
    assert {ch.id for ch in chunks} == {"chatcmpl-my-request-7"}
    ids = [t for ch in chunks if ch.choices for t in ch.choices[0].model_extra["token_ids"]]
    assert len(ids) == chunks[-1].usage.completion_tokens == 20  # ignore_eos: full length
    r = client.completions.create(model=server.model, prompt="abc", max_tokens=3,
                                  extra_body={"request_id": "r-8"})
    assert r.id == "cmpl-r-8"


def _bad_requests(server: Server, client: openai.OpenAI) -> list[tuple]:
    """Sends every bad request; returns (case, status, param, message or exception)."""
    out = []

    def via_client(case: str, **kwargs):
        body = dict(model=server.model, messages=user("hi"))
        body.update(kwargs)
        try:
            client.chat.completions.create(**body)
        except openai.APIStatusError as e:
            out.append((case, e.status_code, e.body.get("param") if isinstance(e.body, dict) else None,
                        e))
            return
        out.append((case, 200, None, None))

    via_client("max_tokens 0", max_tokens=0)
    via_client("temperature -1", temperature=-1)
    via_client("top_p 0", top_p=0)
    via_client("top_p 1.5", top_p=1.5)
    via_client("top_k -1", extra_body={"top_k": -1})
    via_client("unknown model", model="gpt-4o")
    via_client("empty messages", messages=[])
    via_client("n 2", n=2)

    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    url = f"{server.url}/v1/chat/completions"

    def raw(case: str, content: bytes):
        r = httpx2.post(url, content=content, headers=headers, timeout=30)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        out.append((case, r.status_code, err["param"], err["message"]))

    raw("invalid UTF-8", b'{"messages":[{"role":"user","content":"bad \xc3\x28 bytes"}]}')
    raw("malformed JSON", b'{"messages":[{"role":"user","content":"x"}')
    raw("oversized body",
        json.dumps({"messages": user("x" * (2 * MAX_BODY))}).encode())
    return out


def test_bad_requests_while_a_stream_runs(client: openai.OpenAI, server: Server):
    n_tokens = 400
    stream = client.chat.completions.create(
        model=server.model, messages=user("Go on"), max_tokens=n_tokens, temperature=0.8, seed=1,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant"

    got = {case: (status, param, detail) for case, status, param, detail in
           _bad_requests(server, client)}
    expected = {
        "max_tokens 0": (400, "max_tokens"),
        "temperature -1": (400, "temperature"),
        "top_p 0": (400, "top_p"),
        "top_p 1.5": (400, "top_p"),
        "top_k -1": (400, "top_k"),
        "unknown model": (404, "model"),
        "empty messages": (400, "messages"),
        "n 2": (400, "n"),
        "invalid UTF-8": (400, "messages[0].content"),
        "malformed JSON": (400, None),
        "oversized body": (413, None),
    }
    for case, (status, param) in expected.items():
        assert got[case][:2] == (status, param), (case, got[case])
    assert "JSON" in got["malformed JSON"][2]
    assert str(MAX_BODY) in got["oversized body"][2]
    assert "UTF-8" in got["invalid UTF-8"][2]
    for case in ("temperature -1", "top_p 1.5", "top_k -1", "max_tokens 0"):
        assert case.split()[0] in str(got[case][2]), got[case]  # the message names the field

    # The stream ran on, unharmed, to its full length.
    rest = list(stream)
    assert rest[-1].usage.completion_tokens == n_tokens
    assert [ch.choices[0].finish_reason for ch in rest if ch.choices][-1] == "length"


def test_api_key_required(server: Server):
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=server.model, messages=user("hi"), max_tokens=2)
    assert e.value.status_code == 401
    assert e.value.body["code"] == "UNAUTHENTICATED"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    r = httpx2.post(f"{server.url}/v1/completions", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401
    assert "API key" in r.json()["error"]["message"]
    # Health and metrics need no key.
    assert httpx2.get(f"{server.url}/health", timeout=10).status_code == 200
    assert httpx2.get(f"{server.url}/metrics", timeout=10).status_code == 200


def test_client_disconnect_cancels_and_frees_kv(server: Server):
    cancelled = 'pdserve_requests_total{finish_reason="cancelled"}'
    before = server.metric(cancelled) if cancelled in server.metrics() else 0.0
    with httpx2.Client(timeout=30) as http:
        with http.stream("POST", f"{server.url}/v1/chat/completions",
                         headers={"Authorization": f"Bearer {API_KEY}"},
                         json={"messages": user("Go"), "max_tokens": 1500, "stream": True,
                               "ignore_eos": True}) as r:
            assert r.status_code == 200
            for _ in r.iter_bytes():
                break  # one piece of the stream, then hang up
    end = time.monotonic() + 10
    while time.monotonic() < end:
        text = server.metrics()
        if cancelled in text and server.metric(cancelled) > before:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the request was not cancelled after the client went away")
    assert server.metric("pdserve_running_sequences") == 0
    assert server.metric("pdserve_kv_blocks_used") == 0


def test_metrics_after_traffic(client: openai.OpenAI, server: Server):
    client.chat.completions.create(model=server.model, messages=user("hi"), max_tokens=4)
    text = server.metrics()
    for name in ("pdserve_time_to_first_token_seconds", "pdserve_time_per_output_token_seconds",
                 "pdserve_e2e_request_latency_seconds", "pdserve_queue_time_seconds",
                 "pdserve_prefill_step_seconds", "pdserve_decode_step_seconds"):
        assert f"# TYPE {name} histogram" in text
        assert server.metric(f"{name}_count") > 0, name
    assert server.metric("pdserve_generation_tokens_total") >= 4
    assert server.metric("pdserve_prompt_tokens_total") > 0
    assert server.metric('pdserve_requests_total{finish_reason="length"}') >= 1
    assert server.metric("pdserve_kv_blocks_free") > 0
    assert 'pdserve_http_requests_total{endpoint="/v1/chat/completions",status="200"}' in text


def test_prefix_cache_reports_cached_tokens(client: openai.OpenAI, server: Server):
    """A next chat turn reuses the KV of the earlier turn's prompt: usage says how much (whole
    blocks of 16 tokens, never the whole prompt), streaming and not, and the Prometheus counters
    move by the same amounts."""
    system = {"role": "system", "content": " ".join(f"rule{i} applies" for i in range(60))}
    first = [system, {"role": "user", "content": "Which rule comes first?"}]
    hits0 = server.metric("pdserve_prefix_cache_hits_tokens_total")
    queries0 = server.metric("pdserve_prefix_cache_queries_tokens_total")
    r1 = client.chat.completions.create(model=server.model, messages=first, max_tokens=4,
                                        temperature=0)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    second = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "And the last one?"}]
    stream = client.chat.completions.create(model=server.model, messages=second, max_tokens=4,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    usage = [c.usage for c in stream if c.usage is not None][-1]
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens - 16 - 3, (cached, r1.usage.prompt_tokens)
    assert cached % 16 == 0 and 0 < cached < usage.prompt_tokens
    assert server.metric("pdserve_prefix_cache_hits_tokens_total") - hits0 == cached
    assert (server.metric("pdserve_prefix_cache_queries_tokens_total") - queries0 ==
            r1.usage.prompt_tokens + usage.prompt_tokens)
    assert server.metric("pdserve_prefix_cache_blocks") >= cached // 16


def test_promtool_check_metrics(client: openai.OpenAI, server: Server):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not installed (Debian package prometheus, scripts/setup.sh)"
    client.completions.create(model=server.model, prompt="x", max_tokens=3)
    r = subprocess.run([promtool, "check", "metrics"], input=server.metrics(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "" and r.stderr.strip() == "", r.stdout + r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_scrapes_pdserve(client: openai.OpenAI, server: Server, tmp_path: Path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus not installed (Debian package prometheus, scripts/setup.sh)"
    target = urllib.parse.urlparse(server.url).netloc
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: pdserve\n"
        f"    static_configs:\n      - targets: ['{target}']\n")
    port = _free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(q: str) -> list:
        try:
            r = httpx2.get(api, params={"query": q}, timeout=5)
        except httpx2.TransportError:
            return []
        if r.status_code != 200:
            return []
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        for _ in range(3):
            client.chat.completions.create(model=server.model, messages=user("hi"), max_tokens=8)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited: {proc.stderr.read()}")
            up = query('up{job="pdserve"}')
            tokens = query('pdserve_generation_tokens_total{job="pdserve"}')
            if up and up[0]["value"][1] == "1" and tokens and float(tokens[0]["value"][1]) >= 24:
                break
            time.sleep(0.5)
        else:
            pytest.fail("prometheus never scraped pdserve's metrics")
        names = {r["metric"]["__name__"] for r in query('{__name__=~"pdserve_.+", job="pdserve"}')}
        for name in ("pdserve_time_to_first_token_seconds_bucket",
                     "pdserve_time_per_output_token_seconds_bucket",
                     "pdserve_e2e_request_latency_seconds_count", "pdserve_running_sequences",
                     "pdserve_kv_blocks_free", "pdserve_prompt_tokens_total",
                     "pdserve_requests_total", "pdserve_http_requests_total"):
            assert name in names, (name, sorted(names))
        # docs/metrics.md's p99 TTFT query answers a number.
        p99 = query("histogram_quantile(0.99, sum by (le) "
                    "(pdserve_time_to_first_token_seconds_bucket))")
        assert p99 and 0 < float(p99[0]["value"][1]) < 60, p99
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_default_model_chat(pd_serve_bin: Path, repo_root: Path):
    """The default model (Gemma 3 270M) through the HTTP API: its chat template, real text."""
    assert (repo_root / "models" / "gemma-3-270m-q4_k_m.gguf").is_file(), \
        "the default model is not installed (scripts/setup.sh assembles it)"
    srv = _start(pd_serve_bin, [])  # no --model: the default one, no API key
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0,
                               timeout=120)
        kwargs = dict(model="gemma-3-270m-q4_k_m", max_tokens=12, temperature=0,
                      messages=user("What is the capital of France?"))
        full = client.chat.completions.create(**kwargs)
        text = full.choices[0].message.content
        assert text.strip(), full
        assert full.usage.prompt_tokens > 8  # Gemma's turn markers around the question
        streamed = "".join(ch.choices[0].delta.content or ""
                           for ch in client.chat.completions.create(**kwargs, stream=True))
        assert streamed == text
    finally:
        _stop(srv)
