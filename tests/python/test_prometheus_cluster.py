"""deploy/prometheus and deploy/grafana against a live local cluster: `pdctl up` + a real Prometheus.

`pdctl up` starts the router, prefill and decode daemons on loopback; deploy/prometheus/
pdctl_up_targets.py turns the listing it prints into the targets file; a Prometheus server (on a
free port, with its own storage) runs deploy/prometheus/prometheus.yml as shipped (intervals
shortened to 1 s, the targets file in a temporary folder). After a few chat requests through the
router: every target is up with its `pool` label, every expression of the Grafana dashboard
evaluates, the core panels and recording rules have data.

A missing pdctl (conftest's `pdctl` fixture: $PDCTL, else build/bin/pdctl) or Prometheus (Debian's
prometheus, installed by scripts/setup.sh) fails the tests: neither is optional.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_deploy import POOLS, PROM, REPO, dashboard, documented_metrics, pdctl_up_targets

# Dashboard panels that must have data once requests went through the cluster.
PANELS_WITH_DATA = ("Time to first token", "Time per output token", "End-to-end request latency",
                    "Queue depth", "KV cache usage", "Requests by finish reason",
                    "Tokens per second")
KV_TRANSFER_PANELS = ("KV transfer latency", "KV transfer throughput", "KV transfer layers")


@pytest.fixture(scope="module")
def pdctl_up(pdctl: Path) -> Path:
    """conftest's pdctl (failing when it is not built), checked to have `pdctl up`."""
    help_text = subprocess.run([str(pdctl), "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    assert any(line.split()[:1] == ["up"] for line in help_text.splitlines()), \
        f"{pdctl} --help lists no `up` subcommand (tools/pdctl/up_cmd.cc):\n{help_text}"
    assert shutil.which("prometheus") is not None, \
        "prometheus not installed (Debian package prometheus, scripts/setup.sh)"
    return pdctl


def get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, ok, timeout: float, proc: subprocess.Popen | None = None,
             log: Path | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        result = ok()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-4000:] if log else ""
            pytest.fail(f"{what}: process exited {proc.returncode}: {tail}")
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cluster(pdctl_up: Path, tmp_path_factory):
    """Runs `pdctl up` (router on free ports) and writes its targets file: {pool: [host:port]}
    plus the targets folder for file service discovery."""
    tmp = tmp_path_factory.mktemp("pdctl_up")
    # Output to files: a pipe nobody reads would block the cluster once full.
    out, err = tmp / "stdout.log", tmp / "stderr.log"
    # The test's chat prompts are short; by default (router.disaggregate_min_prompt 512) the
    # decode node would prefill them itself and the KV-transfer panels would have no data.
    config = tmp / "cluster.yaml"
    # A fixed draft length: test_decode_node_speculates needs drafts, whatever the timing.
    config.write_text("router: {disaggregate_min_prompt: 0}\nspeculative: {fixed_k: 4}\n")
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [str(pdctl_up), "up", "--prefill", "1", "--decode", "1", "--grpc-port", "0",
             "--http-port", "0", "--threads", "1", "--config", str(config)], cwd=REPO,
            stdout=o, stderr=e)
    try:
        groups = wait_for("the listing `pdctl up` prints when ready",
                          lambda: pdctl_up_targets().parse(out.read_text().splitlines(True)),
                          timeout=300, proc=proc, log=err)
        pdctl_up_targets().write(groups, tmp / "targets" / "pdctl-up.json")
        targets: dict[str, list[str]] = {}
        for g in groups:
            targets.setdefault(g["labels"]["pool"], []).extend(g["targets"])
        yield targets, tmp / "targets"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory):
    """deploy/prometheus/prometheus.yml as shipped, but 1 s intervals and the test's targets."""
    _, targets_dir = cluster
    tmp = tmp_path_factory.mktemp("prometheus")
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str(PROM / f) for f in cfg["rule_files"]]
    for sd in cfg["scrape_configs"][0]["file_sd_configs"]:
        sd["files"] = [str(targets_dir / Path(f).name) for f in sd["files"]]
        sd["refresh_interval"] = "1s"
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [shutil.which("prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("prometheus to get ready", lambda: get(f"{url}/-/ready")[0] == 200, 60, proc,
                 log)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(prom: str, expr: str) -> list[dict]:
    status, body = get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body or b"{}")
    assert status == 200 and answer.get("status") == "success", (expr, status, body[:500])
    return answer["data"]["result"]


def promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$pool", ".*")


@pytest.fixture(scope="module")
def scraped(cluster, prometheus) -> str:
    targets, _ = cluster
    n = sum(len(t) for t in targets.values())
    wait_for("every pdserve target up in Prometheus",
             lambda: len(query(prometheus, 'up{job="pdserve"} == 1')) == n, timeout=60)
    (router,) = targets["router"]
    for i in range(4):
        body = json.dumps({"messages": [{"role": "user", "content": f"Say hi #{i}"}],
                           "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{router}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert r.status == 200
    # A few scrapes and rule evaluations after the last request.
    wait_for("the requests to reach Prometheus",
             lambda: query(prometheus, "sum(pdserve_requests_total) > 0"), timeout=30)
    time.sleep(3)
    return prometheus


def test_targets_carry_their_pool(scraped: str):
    pools = {r["metric"]["pool"] for r in query(scraped, 'up{job="pdserve"}')}
    assert pools == set(POOLS)


def test_dashboard_queries_evaluate(scraped: str):
    documented = documented_metrics()
    for panel in dashboard()["panels"]:
        results = [query(scraped, promql(t["expr"])) for t in panel["targets"]]
        want_data = panel["title"].startswith(PANELS_WITH_DATA) or (
            panel["title"].startswith(KV_TRANSFER_PANELS)
            and "pdserve_kv_transfer_seconds" in documented)
        if want_data:
            assert any(results), f"panel {panel['title']!r}: no data"


def test_recording_rules_have_data(scraped: str):
    for rule in ("pool:pdserve_time_to_first_token_seconds:p99_rate5m",
                 "pool:pdserve_e2e_request_latency_seconds:p50_rate5m",
                 "pool:pdserve_generation_tokens:rate1m", "pool:pdserve_kv_usage:ratio"):
        assert query(scraped, rule), rule


def test_decode_node_speculates(cluster, scraped: str):
    """The decode node runs speculative decoding (the default n-gram drafter) on a request the
    router disaggregated: the client's usage counts accepted drafts and Prometheus sees the
    decode pool's pdserve_spec_* counters (docs/speculative.md)."""
    targets, _ = cluster
    (router,) = targets["router"]
    # A passage and an instruction to copy it: the continuation quotes the prompt, which prompt
    # lookup predicts.
    passage = ("The river town woke before the sun. Fishermen carried nets down the stone steps, "
               "bakers pulled the first loaves from brick ovens, and the ferry bell rang twice.")
    body = json.dumps({"prompt": f"Passage:\n{passage}\n\nThe same passage, copied word for "
                                 "word:\n",
                       "max_tokens": 40, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://{router}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        usage = json.loads(r.read())["usage"]
    assert usage["completion_tokens"] == 40
    assert usage["completion_tokens_details"]["accepted_prediction_tokens"] > 0, usage
    wait_for("the decode pool's accepted drafts in Prometheus",
             lambda: query(scraped, 'sum(pdserve_spec_accepted_tokens_total{pool="decode"}) > 0'),
             timeout=30)
    assert not query(scraped, 'sum(pdserve_spec_drafts_total{pool="prefill"}) > 0')
