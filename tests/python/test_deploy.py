"""deploy/: Kubernetes manifests, Prometheus and Grafana configs, the Dockerfile. No cluster needed.

Checked: every manifest parses (multi-document YAML) with a known apiVersion for its kind and
matches the Kubernetes API schema (the models of the official Python client, generated from the
Kubernetes OpenAPI spec: no unknown or misspelt field, no missing required one, the right types);
the kustomization lists every manifest, names the namespace every object lands in, and generates the
ConfigMaps the workloads mount; selectors match pod labels; Service target ports and probe ports
exist on the containers and equal the ports that the pool's config (a generated ConfigMap) sets;
probe paths are ones the servers answer; each pool has an HPA and a PodDisruptionBudget; the HPAs'
custom metrics are produced by the Prometheus adapter rules; the router's node list covers every pod
the HPAs may create; the configs use only keys of the config schema and the real parser accepts them
(the pool's daemon, or the newest daemon built: one schema); prefill and decode agree on model and
KV layout; the Prometheus configs and rules pass promtool; `pdctl up`'s listing becomes the local
targets file; the Kubernetes scrape job's relabelling, run on the pods the Deployments make, gives
one target per pod with the right port and `pool`; every PromQL expression (dashboard, rules,
adapter) parses and names only metrics of docs/metrics.md; the Dockerfile installs setup.sh's
packages and ships the daemons the Deployments run.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
PROM = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"

# kind -> the apiVersion it must have (current, non-deprecated versions).
API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "HorizontalPodAutoscaler": "autoscaling/v2",
    "PodDisruptionBudget": "policy/v1",
    "Kustomization": "kustomize.config.k8s.io/v1beta1",
}
POOLS = ("router", "prefill", "decode")
DAEMONS = ("pd-router", "pd-prefill", "pd-decode", "pd-serve")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
METRIC_RE = re.compile(r"(?<![\w:])pdserve_\w+")


# ---------------------------------------------------------------------------------------------
# Loading


def load_yaml_docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@functools.cache
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@functools.cache
def generated_configmaps() -> dict[str, dict[str, str]]:
    """configMapGenerator of the kustomization: ConfigMap name -> {key: file content}."""
    out = {}
    for gen in kustomization().get("configMapGenerator", []):
        data = {}
        for spec in gen.get("files", []):
            key, _, rel = spec.rpartition("=")
            data[key or Path(rel).name] = (K8S / rel).read_text()
        out[gen["name"]] = data
    return out


@functools.cache
def objects() -> list[dict]:
    """What `kubectl apply -k deploy/k8s` creates, before kustomize's renames. Shared: do not
    modify (copy first)."""
    objs = [d for r in kustomization()["resources"] for d in load_yaml_docs(K8S / r)]
    for name, data in generated_configmaps().items():
        objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                     "data": data})
    return objs


def of_kind(kind: str) -> list[dict]:
    return [o for o in objects() if o["kind"] == kind]


def deployments() -> dict[str, dict]:
    """Pool name (app.kubernetes.io/component) -> its workload: the router's Deployment, the
    prefill and decode StatefulSets."""
    return {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in of_kind("Deployment") + of_kind("StatefulSet")}


def main_container(dep: dict) -> dict:
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, dep["metadata"]["name"]
    return containers[0]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pool_config(dep: dict) -> tuple[str, str, dict]:
    """The config file a Deployment's daemon reads: (path in the container, text, parsed)."""
    c = main_container(dep)
    cmd = c["command"] + c.get("args", [])
    assert "--config" in cmd, f"{dep['metadata']['name']}: no --config in {cmd}"
    path = cmd[cmd.index("--config") + 1]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    cms = generated_configmaps()
    for m in c["volumeMounts"]:
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            cm = volumes[m["name"]]["configMap"]["name"]
            text = cms[cm][path[len(prefix):]]
            return path, text, yaml.safe_load(text) or {}
    raise AssertionError(f"{dep['metadata']['name']}: {path} is on no ConfigMap volume")


def container_port(c: dict, port) -> int:
    """A probe's or Service's port (a number or a container port's name) as a number."""
    for p in c.get("ports", []):
        if port in (p["name"], p["containerPort"]):
            return p["containerPort"]
    raise AssertionError(f"container {c['name']} has no port {port!r}")


def flatten(d: dict, prefix: str = "") -> set[str]:
    """Key paths: `kv.dtype`; keys of mappings in a list as `router.nodes[].name`."""
    keys = set()
    for k, v in d.items():
        path = f"{prefix}{k}"
        keys.add(path)
        if isinstance(v, dict):
            keys |= flatten(v, path + ".")
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, dict):
                    keys |= flatten(item, path + "[].")
    return keys


@functools.cache
def schema_keys() -> set[str]:
    """Keys of the config schema: every file in configs/ (serve.yaml lists every field) and the
    key tables of docs/config.md."""
    keys = set()
    for f in sorted((REPO / "configs").glob("*.yaml")):
        keys |= flatten(yaml.safe_load(f.read_text()) or {})
    for m in re.finditer(r"^\| `([a-z_][\w.\[\]]*)` \|", (REPO / "docs/config.md").read_text(),
                         re.M):
        parts = m.group(1).split(".")
        keys |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return keys


def unknown_keys(cfg: dict) -> set[str]:
    """Keys of `cfg` the schema does not know. Items of a known list whose fields the schema does
    not spell out (no `list[].x` key anywhere) are not second-guessed."""
    known = schema_keys()
    out = set()
    for k in flatten(cfg) - known:
        head = k.split("[].")[0]
        if "[]." in k and head in known and not any(s.startswith(head + "[].") for s in known):
            continue
        out.add(k)
    return out


@functools.cache
def documented_metrics() -> set[str]:
    text = (REPO / "docs/metrics.md").read_text()
    return set(re.findall(r"^\|\s*`(pdserve_\w+)`", text, re.M))


def base_metric(name: str, documented: set[str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in documented:
            return name[: -len(suffix)]
    return name


@functools.cache
def dashboard() -> dict:
    return json.loads((GRAFANA / "pdserve.json").read_text())


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*\w+\)", q)
            exprs.append(m.group(1) if m else q)
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load((PROM / "rules/pdserve.rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def adapter_rules() -> list[dict]:
    (cm,) = load_yaml_docs(K8S / "prometheus-adapter.yaml")
    return yaml.safe_load(cm["data"]["config.yaml"])["rules"]


def adapter_exprs() -> list[str]:
    out = []
    for r in adapter_rules():
        series = re.match(r"\w+", r["seriesQuery"]).group(0)
        out.append(r["seriesQuery"])
        out.append(r["metricsQuery"].replace("<<.Series>>", series)
                   .replace("<<.LabelMatchers>>", 'namespace="pdserve",pod="p"')
                   .replace("<<.GroupBy>>", "pod"))
    return out


def grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "5m").replace("$pool", ".*")


def all_exprs() -> dict[str, list[str]]:
    return {"dashboard": [grafana_to_promql(e) for e in dashboard_exprs()],
            "rules": rule_exprs(), "adapter": adapter_exprs()}


def find_binary(name: str) -> Path | None:
    """$PD_BIN_DIR, the folder of $PDCTL, build/bin, then the newest build*/bin holding it."""
    dirs = [Path(os.environ[v]) if v == "PD_BIN_DIR" else Path(os.environ[v]).parent
            for v in ("PD_BIN_DIR", "PDCTL") if os.environ.get(v)]
    dirs.append(REPO / "build" / "bin")
    for d in dirs:
        p = d / name if d.is_absolute() else REPO / d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    found = [p for p in REPO.glob(f"build*/bin/{name}") if os.access(p, os.X_OK)]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def promtool_check_rules(promtool: str, tmp_path: Path,
                         exprs: list[str]) -> subprocess.CompletedProcess:
    """promtool parses each expression as the expr of a recording rule."""
    f = tmp_path / "exprs.rules.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": [
        {"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    return subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool, from Debian's prometheus (scripts/setup.sh installs it). Fails when missing."""
    path = shutil.which("promtool")
    assert path, "promtool not installed (Debian package prometheus, scripts/setup.sh)"
    return path


# ---------------------------------------------------------------------------------------------
# Kubernetes manifests


def test_manifests_parse_with_known_api_versions():
    files = sorted(K8S.glob("*.yaml"))
    assert files
    for f in files:
        for d in load_yaml_docs(f):
            kind = d.get("kind")
            assert kind in API_VERSIONS, f"{f.name}: unexpected kind {kind!r}"
            assert d.get("apiVersion") == API_VERSIONS[kind], (f.name, kind, d.get("apiVersion"))
            if kind != "Kustomization":
                name = d["metadata"]["name"]
                assert DNS1123.match(name) and len(name) <= 63, (f.name, name)


def test_kustomization_lists_every_manifest():
    k = kustomization()
    listed = set(k["resources"])
    # prometheus-adapter.yaml belongs to the adapter's namespace and is applied on its own.
    present = {f.name for f in K8S.glob("*.yaml")} - {"kustomization.yaml",
                                                      "prometheus-adapter.yaml"}
    assert listed == present
    for name, data in generated_configmaps().items():
        assert data, name
    names = [(o["kind"], o["metadata"]["name"]) for o in objects()]
    assert len(names) == len(set(names)), "duplicate objects"


# Kubernetes API schema: kind -> the model of the official Python client (`kubernetes`,
# requirements-dev.txt) for API_VERSIONS[kind]. Its models are generated from the Kubernetes
# OpenAPI spec as pydantic models that refuse unknown fields.
SCHEMA_MODELS = {
    "Namespace": "V1Namespace",
    "ConfigMap": "V1ConfigMap",
    "Service": "V1Service",
    "Deployment": "V1Deployment",
    "StatefulSet": "V1StatefulSet",
    "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
}


def _paths(v, p: str = "") -> set[str]:
    """Every key path in `v`, as pydantic names them: `spec.ports.0.port`."""
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    return {p} | {q for k, x in items for q in _paths(x, f"{p}.{k}" if p else str(k))}


def schema_errors(doc: dict) -> list[str]:
    """What the Kubernetes API would refuse in `doc` (one object of a manifest): validated
    strictly (no type coercion, no unknown field, every required one present), then dumped back
    under the API's field names, which shows a field written under its Python name
    (`container_port`): the models take those, the API server does not."""
    import kubernetes.client
    import pydantic

    model = getattr(kubernetes.client, SCHEMA_MODELS[doc["kind"]])
    try:
        obj = model.model_validate(doc, strict=True)
    except pydantic.ValidationError as e:
        return [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
    back = obj.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"{p}: not a field of the Kubernetes API" for p in sorted(_paths(doc) - _paths(back))]


def test_schema_check_catches_mistakes():
    """The schema check itself: a misspelt field, a Python-style name, a missing required field,
    a wrong type."""
    dep = json.loads(json.dumps(deployments()["router"]))
    assert schema_errors(dep) == []
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    del c["name"]
    c["ports"][0]["containerPort"] = str(c["ports"][0]["containerPort"])
    errors = "\n".join(schema_errors(dep))
    assert "containers.0.readinesProbe: Extra inputs are not permitted" in errors, errors
    assert "containers.0.name: Field required" in errors, errors
    assert "containers.0.ports.0.containerPort: Input should be a valid integer" in errors, errors
    dep = json.loads(json.dumps(deployments()["router"]))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["ports"][0]["container_port"] = c["ports"][0].pop("containerPort")
    assert schema_errors(dep) == [
        "spec.template.spec.containers.0.ports.0.container_port: not a field of the Kubernetes API"]


def test_manifests_match_the_kubernetes_schema():
    """What `kubectl apply --dry-run` would refuse client-side, with no cluster and no kubectl:
    every object of deploy/k8s (and the adapter's ConfigMap) against its API type."""
    checked = set()
    for f in sorted(K8S.glob("*.yaml")):
        for i, d in enumerate(load_yaml_docs(f)):
            if d["kind"] == "Kustomization":
                continue
            errors = schema_errors(d)
            assert not errors, f"{f.name}, object {i} ({d['kind']}):\n" + "\n".join(errors)
            checked.add(d["kind"])
    assert checked == set(SCHEMA_MODELS), set(SCHEMA_MODELS) - checked


def test_kustomization_sets_namespace_and_generates_mounted_configmaps():
    """What `kubectl kustomize` would do with it: put every object in the kustomization's
    namespace (which namespace.yaml creates) and rename the generated ConfigMaps, which the
    workloads must therefore mount by their generator names."""
    k = kustomization()
    assert set(k) <= {"apiVersion", "kind", "namespace", "resources", "configMapGenerator",
                      "images"}, set(k)
    (ns,) = of_kind("Namespace")
    assert k["namespace"] == ns["metadata"]["name"] == "pdserve"
    for o in objects():
        assert o["metadata"].get("namespace", k["namespace"]) == k["namespace"], o["metadata"]
    generated = set(generated_configmaps())
    for gen in k["configMapGenerator"]:
        assert set(gen) <= {"name", "files", "literals", "options"}, gen
    mounted = set()
    for dep in deployments().values():
        for v in dep["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in v:
                assert v["configMap"]["name"] in generated, v
                mounted.add(v["configMap"]["name"])
    assert mounted == generated, generated - mounted
    images = {c["image"].split(":")[0] for d in deployments().values()
              for c in d["spec"]["template"]["spec"]["containers"] +
              d["spec"]["template"]["spec"].get("initContainers", [])}
    assert {i["name"] for i in k["images"]} <= images, (k["images"], images)


def test_every_pool_has_one_workload():
    assert sorted(deployments()) == sorted(POOLS)
    assert deployments()["router"]["kind"] == "Deployment"


def test_router_lists_every_node_the_hpas_may_create():
    """router.nodes is static: it names each StatefulSet pod (stable DNS through the headless
    Service) up to the HPA's maxReplicas, on the node's gRPC port."""
    _, _, cfg = pool_config(deployments()["router"])
    nodes = cfg["router"]["nodes"]
    want = []
    for pool in ("prefill", "decode"):
        sts = deployments()[pool]
        assert sts["kind"] == "StatefulSet", pool
        svc = sts["spec"]["serviceName"]
        (headless,) = [s for s in of_kind("Service") if s["metadata"]["name"] == svc]
        assert headless["spec"]["clusterIP"] == "None", svc
        (hpa,) = [h for h in of_kind("HorizontalPodAutoscaler")
                  if h["spec"]["scaleTargetRef"]["name"] == sts["metadata"]["name"]]
        port = pool_config(sts)[2]["grpc"]["port"]
        for i in range(hpa["spec"]["maxReplicas"]):
            pod = f"{sts['metadata']['name']}-{i}"
            want.append({"name": f"{pool}-{i}", "role": pool, "address": f"{pod}.{svc}:{port}"})
    assert nodes == want


@pytest.mark.parametrize("pool", POOLS)
def test_selector_matches_template_labels(pool: str):
    dep = deployments()[pool]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert selects(sel, dep["spec"]["template"]["metadata"]["labels"])
    # No other pool's pods match: pools scale and roll independently.
    for other, o in deployments().items():
        if other != pool:
            assert not selects(sel, o["spec"]["template"]["metadata"]["labels"]), other


def test_services_select_one_pool_and_target_container_ports():
    for svc in of_kind("Service"):
        sel = svc["spec"]["selector"]
        matched = [p for p, d in deployments().items()
                   if selects(sel, d["spec"]["template"]["metadata"]["labels"])]
        assert len(matched) == 1, (svc["metadata"]["name"], matched)
        c = main_container(deployments()[matched[0]])
        for port in svc["spec"]["ports"]:
            container_port(c, port.get("targetPort", port["port"]))


@pytest.mark.parametrize("pool", POOLS)
def test_pool_has_hpa_and_pdb(pool: str):
    dep = deployments()[pool]
    name = dep["metadata"]["name"]
    hpas = [h for h in of_kind("HorizontalPodAutoscaler")
            if h["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": dep["kind"],
                                               "name": name}]
    assert len(hpas) == 1, name
    spec = hpas[0]["spec"]
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    assert spec["metrics"]
    assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    pdbs = [p for p in of_kind("PodDisruptionBudget")
            if selects(p["spec"]["selector"]["matchLabels"], labels)]
    assert len(pdbs) == 1, name
    assert ("minAvailable" in pdbs[0]["spec"]) != ("maxUnavailable" in pdbs[0]["spec"])


def test_hpa_custom_metrics_come_from_the_adapter():
    produced = {r["name"]["as"] for r in adapter_rules()}
    used = set()
    for h in of_kind("HorizontalPodAutoscaler"):
        for m in h["spec"]["metrics"]:
            assert m["type"] in ("Resource", "Pods"), m
            if m["type"] == "Pods":
                assert m["pods"]["target"]["type"] == "AverageValue", m
                used.add(m["pods"]["metric"]["name"])
    assert used, "no HPA keys on a custom metric"
    assert used <= produced, f"HPA metrics without an adapter rule: {used - produced}"
    for r in adapter_rules():
        series = re.match(r"\w+", r["seriesQuery"]).group(0)
        assert re.fullmatch(r["name"]["matches"], series), r
        assert set(r["resources"]["overrides"]) == {"namespace", "pod"}, r


@pytest.mark.parametrize("pool", POOLS)
def test_containers_have_requests_and_limits(pool: str):
    def qty(v) -> float:
        m = re.fullmatch(r"([\d.]+)(m|Ki|Mi|Gi|Ti)?", str(v))
        assert m, v
        scale = {None: 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        return float(m.group(1)) * scale[m.group(2)]

    spec = deployments()[pool]["spec"]["template"]["spec"]
    for c in spec["containers"] + spec.get("initContainers", []):
        res = c["resources"]
        for r in ("cpu", "memory"):
            assert qty(res["requests"][r]) <= qty(res["limits"][r]), (c["name"], r)


@pytest.mark.parametrize("pool", POOLS)
def test_config_keys_are_in_the_schema(pool: str):
    _, _, cfg = pool_config(deployments()[pool])
    unknown = unknown_keys(cfg)
    assert not unknown, (f"{pool}: keys not in configs/*.yaml or docs/config.md: "
                         f"{sorted(unknown)}")


@pytest.mark.parametrize("pool", POOLS)
def test_config_accepted_by_the_real_parser(pool: str, tmp_path: Path):
    dep = deployments()[pool]
    daemon = main_container(dep)["command"][0]
    binary = find_binary(daemon)
    note = ""
    if binary is None:
        # Every daemon parses the same ServeOptions schema (common/config.h): use the newest.
        others = [b for b in map(find_binary, DAEMONS) if b is not None]
        assert others, f"no daemon is built ({', '.join(DAEMONS)}; set PDCTL or PD_BIN_DIR)"
        binary = max(others, key=lambda b: b.stat().st_mtime)
        note = f" ({daemon} not built; the same parser in {binary.name})"
    help_text = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    assert "--model" in help_text, f"{binary} has no --model flag: cannot stop it after the check"
    _, text, _ = pool_config(dep)
    cfg = tmp_path / f"{pool}.yaml"
    cfg.write_text(text)
    # The config is parsed and validated before the model is opened (exit 2 = config error): with
    # a missing model the error must be about the model. Ports 0 keep it off the config's ports.
    args = [str(binary), "--config", str(cfg), "--model", "/nonexistent.gguf"]
    for flag in ("--grpc-port", "--http-port"):
        if flag in help_text:
            args += [flag, "0"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "/nonexistent.gguf" in r.stderr, (
        f"{binary.name}{note} on {pool}'s config: exit {r.returncode}: {r.stderr}")


@functools.cache
def served_http_paths() -> set[str]:
    """Paths the HTTP servers answer (docs/api.md's endpoint table)."""
    return set(re.findall(r"^\| `GET (/\S+)` \|", (REPO / "docs/api.md").read_text(), re.M))


@pytest.mark.parametrize("pool", POOLS)
def test_ports_and_probes_match_the_config(pool: str):
    dep = deployments()[pool]
    c = main_container(dep)
    _, _, cfg = pool_config(dep)
    http, grpc = cfg.get("http", {}), cfg.get("grpc", {})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for name, section in (("http", http), ("grpc", grpc)):
        assert section.get("enabled", True), f"{pool}: {name} disabled but probed/exposed"
        assert section.get("host") in ("0.0.0.0", "::"), (
            f"{pool}: {name}.host must listen on all interfaces for probes and Services")
        assert ports[name] == section.get("port"), f"{pool}: container port {name}"
    probes = {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c}
    assert {"readinessProbe", "livenessProbe"} <= set(probes), pool
    assert any("grpc" in p for p in probes.values()), f"{pool}: no gRPC health probe"
    assert any("httpGet" in p for p in probes.values()), f"{pool}: no HTTP /health probe"
    for kind, p in probes.items():
        if "httpGet" in p:
            assert container_port(c, p["httpGet"]["port"]) == http["port"], (pool, kind)
            assert p["httpGet"]["path"] in served_http_paths(), (pool, kind)
            assert p["httpGet"]["path"] == "/health", (pool, kind)
        elif "grpc" in p:
            # grpc.health.v1.Health on the gRPC port; the probe takes a number, not a name.
            assert p["grpc"]["port"] == grpc["port"], (pool, kind)
            assert p["grpc"].get("service", "") in ("", "pdserve.v1.Chat"), (pool, kind)
        else:
            raise AssertionError(f"{pool} {kind}: neither httpGet nor grpc")
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == http["port"], pool
    assert ann["prometheus.io/path"] in served_http_paths(), pool


def test_pools_agree_on_model_and_kv_layout():
    """Prefill pushes KV blocks into blocks the decode node reserved: same model, same block
    size and element type; the router tokenizes with the same model."""
    cfgs = {pool: pool_config(dep)[2] for pool, dep in deployments().items()}
    assert len({c["model"]["path"] for c in cfgs.values()}) == 1
    for key in ("dtype", "block_size"):
        values = {c.get("kv", {}).get(key) for p, c in cfgs.items() if p != "router"}
        assert len(values) == 1, (key, values)


@pytest.mark.parametrize("pool", POOLS)
def test_drain_fits_the_termination_grace(pool: str):
    dep = deployments()[pool]
    _, _, cfg = pool_config(dep)
    grace = cfg.get("shutdown_grace_s", 10)
    assert grace < dep["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)


@pytest.mark.parametrize("pool", POOLS)
def test_model_is_on_the_model_volume(pool: str):
    dep = deployments()[pool]
    _, _, cfg = pool_config(dep)
    model = cfg["model"]["path"]
    spec = dep["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for m in main_container(dep)["volumeMounts"]}
    vol = next(v for p, v in mounts.items() if model.startswith(p.rstrip("/") + "/"))
    # The init step fills the same volume at the same path.
    (init,) = [c for c in spec["initContainers"] if c["name"] == "fetch-model"]
    assert any(m["name"] == vol and model.startswith(m["mountPath"].rstrip("/") + "/")
               for m in init["volumeMounts"])
    script = generated_configmaps()["pdserve-fetch-model"]["fetch-model.sh"]
    assert f"MODEL={model}" in script


# ---------------------------------------------------------------------------------------------
# Prometheus


def test_prometheus_configs_parse():
    for f in ("prometheus.yml", "prometheus-k8s.yml"):
        cfg = yaml.safe_load((PROM / f).read_text())
        for rf in cfg["rule_files"]:
            assert (PROM / rf).is_file(), (f, rf)
        (job,) = cfg["scrape_configs"]
        assert job["job_name"] == "pdserve"


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-k8s.yml"])
def test_promtool_check_config(name: str, promtool: str, tmp_path: Path):
    path = PROM / name
    r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                       timeout=60)
    out = r.stdout + r.stderr
    if r.returncode != 0 and "field kubernetes_sd_configs not found" in out:
        # Debian's promtool is built without Kubernetes service discovery. Check the rest of the
        # config (relabelling, rule files, intervals) with the discovery swapped for a file one,
        # the discovery block by hand; test_k8s_relabelling_* runs the relabelling on real pods.
        cfg = yaml.safe_load(path.read_text())
        for job in cfg["scrape_configs"]:
            (sd,) = job.pop("kubernetes_sd_configs")
            assert sd["role"] == "pod", sd
            assert sd["namespaces"] == {"names": ["pdserve"]}, sd
            job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
        cfg["rule_files"] = [str(PROM / f) for f in cfg["rule_files"]]
        path = tmp_path / name
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                           text=True, timeout=60)
        out = r.stdout + r.stderr
    assert r.returncode == 0, out


def test_promtool_check_rules(promtool: str):
    r = subprocess.run([promtool, "check", "rules",
                        str(PROM / "rules/pdserve.rules.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str] | None:
    """Prometheus relabelling (replace / keep / drop), enough for prometheus-k8s.yml."""
    labels = dict(labels)
    for rc in configs:
        value = rc.get("separator", ";").join(labels.get(s, "") for s in rc.get("source_labels", []))
        m = re.fullmatch(rc.get("regex", "(.*)"), value)
        action = rc.get("action", "replace")
        if action == "keep" and not m or action == "drop" and m:
            return None
        if action == "replace" and m:
            repl = re.sub(r"\$(\d+)", r"\\\1", rc.get("replacement", "$1"))
            labels[rc["target_label"]] = m.expand(repl)
        assert action in ("keep", "drop", "replace"), action
    return labels


def pod_targets(dep: dict, pod_ip: str = "10.0.0.7") -> list[dict[str, str]]:
    """The targets Kubernetes pod discovery gives for one pod of a Deployment, relabelled."""
    meta = dep["spec"]["template"]["metadata"]
    cfg = yaml.safe_load((PROM / "prometheus-k8s.yml").read_text())["scrape_configs"][0]
    base = {"__meta_kubernetes_namespace": "pdserve",
            "__meta_kubernetes_pod_name": f"{dep['metadata']['name']}-abc12",
            "__meta_kubernetes_pod_phase": "Running", "__metrics_path__": "/metrics"}
    for k, v in meta.get("labels", {}).items():
        base["__meta_kubernetes_pod_label_" + re.sub(r"[^\w]", "_", k)] = v
    for k, v in meta.get("annotations", {}).items():
        base["__meta_kubernetes_pod_annotation_" + re.sub(r"[^\w]", "_", k)] = v
    targets = []
    for p in main_container(dep)["ports"]:
        t = relabel({**base, "__address__": f"{pod_ip}:{p['containerPort']}",
                     "__meta_kubernetes_pod_container_port_name": p["name"]},
                    cfg["relabel_configs"])
        if t is not None:
            t = {k: v for k, v in t.items() if not k.startswith("__meta_")}
            if t not in targets:  # Prometheus merges identical targets
                targets.append(t)
    return targets


@pytest.mark.parametrize("pool", POOLS)
def test_k8s_relabelling_gives_one_target_per_pod(pool: str):
    dep = deployments()[pool]
    http_port = pool_config(dep)[2]["http"]["port"]
    (t,) = pod_targets(dep)
    assert t["__address__"] == f"10.0.0.7:{http_port}"
    assert t["__metrics_path__"] == "/metrics"
    assert t["pool"] == pool
    assert t["namespace"] == "pdserve" and t["pod"].startswith(dep["metadata"]["name"])


def test_k8s_relabelling_drops_other_pods():
    dep = json.loads(json.dumps(deployments()["router"]))
    dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] = "false"
    assert pod_targets(dep) == []
    dep = json.loads(json.dumps(deployments()["router"]))
    dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] = "other"
    assert pod_targets(dep) == []


def pdctl_up_targets():
    spec = importlib.util.spec_from_file_location("pdctl_up_targets",
                                                  PROM / "pdctl_up_targets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pdctl_up_listing() -> list[str]:
    """What `pdctl up` prints when ready (1 prefill, 2 decode nodes), made with the printf formats
    of tools/pdctl/up_cmd.cc, so that a change of that output breaks this test."""
    src = (REPO / "tools/pdctl/up_cmd.cc").read_text()
    fmts = [bytes(f, "ascii").decode("unicode_escape") for f in re.findall(
        r'std::printf\(\s*"((?:[^"\\]|\\.)*)"', src)]
    ready = next(f for f in fmts if f.startswith("pdctl up ready"))
    node = next(f for f in fmts if "pid=" in f and "grpc=" in f)
    router = next(f for f in fmts if f.lstrip().startswith("router"))
    return [ready % ("127.0.0.1:50051", "http://127.0.0.1:8080"),
            node % ("prefill", "p0", 11, "127.0.0.1:40001", "http://127.0.0.1:40002"),
            node % ("decode", "d0", 12, "127.0.0.1:40003", "http://127.0.0.1:40004"),
            node % ("decode", "d1", 13, "127.0.0.1:40005", "http://127.0.0.1:40006"),
            router % (14, "http://127.0.0.1:8080", "/tmp/pdctl-up-x"), "pdctl up: running\n"]


def test_pdctl_up_listing_becomes_targets(tmp_path: Path):
    mod = pdctl_up_targets()
    lines = pdctl_up_listing()
    assert mod.parse(lines[:3]) is None, "written before the listing ended"
    groups = mod.parse(lines)
    assert groups == [
        {"targets": ["127.0.0.1:40002"], "labels": {"pool": "prefill"}},
        {"targets": ["127.0.0.1:40004"], "labels": {"pool": "decode"}},
        {"targets": ["127.0.0.1:40006"], "labels": {"pool": "decode"}},
        {"targets": ["127.0.0.1:8080"], "labels": {"pool": "router"}}]
    out = tmp_path / "t.json"
    mod.write(groups, out)
    assert json.loads(out.read_text()) == groups
    # The default output is a file prometheus.yml's file_sd pattern picks up.
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())["scrape_configs"][0]
    patterns = [f for sd in cfg["file_sd_configs"] for f in sd["files"]]
    rel = mod.DEFAULT_OUT.relative_to(PROM).as_posix()
    assert any(fnmatch.fnmatch(rel, p) for p in patterns), (rel, patterns)


# ---------------------------------------------------------------------------------------------
# PromQL: dashboard, rules, adapter


@pytest.mark.parametrize("source", ["dashboard", "rules", "adapter"])
def test_promql_parses(source: str, promtool: str, tmp_path: Path):
    r = promtool_check_rules(promtool, tmp_path, all_exprs()[source])
    assert r.returncode == 0, r.stdout + r.stderr


def used_metrics() -> list[str]:
    documented = documented_metrics()
    names = set()
    for exprs in all_exprs().values():
        for e in exprs:
            names |= {base_metric(n, documented) for n in METRIC_RE.findall(e)}
    return sorted(names)


@pytest.mark.parametrize("metric", used_metrics())
def test_metric_is_documented(metric: str):
    assert metric in documented_metrics(), (
        f"{metric} is used in deploy/ but not documented in docs/metrics.md")


# ---------------------------------------------------------------------------------------------
# Grafana


def test_dashboard_model():
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["pool"]["includeAll"] and variables["pool"]["multi"]
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for p in d["panels"]:
        assert p["datasource"] == ds, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == ds, p["title"]
            assert 'pool=~"$pool"' in t["expr"], (p["title"], t["expr"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
    titles = " | ".join(p["title"] for p in d["panels"])
    for want in ("Time to first token", "Time per output token", "End-to-end",
                 "KV transfer latency", "KV transfer throughput", "Queue depth",
                 "KV cache usage", "finish reason", "Errors by code", "Tokens per second"):
        assert want in titles, want


def test_grafana_provisioning():
    (ds,) = yaml.safe_load(
        (GRAFANA / "provisioning/datasources/prometheus.yml").read_text())["datasources"]
    assert ds["type"] == "prometheus"
    (prov,) = yaml.safe_load(
        (GRAFANA / "provisioning/dashboards/pdserve.yml").read_text())["providers"]
    assert prov["type"] == "file" and prov["options"]["path"].startswith("/")


# ---------------------------------------------------------------------------------------------
# Dockerfile


def setup_packages() -> set[str]:
    text = (REPO / "scripts/setup.sh").read_text()
    block = re.search(r"APT_PACKAGES=\((.*?)\n\)", text, re.S).group(1)
    return {w for line in block.splitlines() for w in line.split("#")[0].split()}


def dockerfile_stages() -> list[str]:
    return re.split(r"^FROM ", (DEPLOY / "Dockerfile").read_text(), flags=re.M)[1:]


def test_dockerfile_build_stage_has_setup_packages():
    build, runtime = dockerfile_stages()
    assert build.startswith("debian:bookworm AS build")
    assert runtime.startswith("debian:bookworm")
    install = re.search(r"apt-get install[^\n]*\\\n(.*?)\n &&", build, re.S).group(1)
    words = {w for w in install.replace("\\", " ").split()}
    assert setup_packages() <= words, f"missing: {setup_packages() - words}"


def test_dockerfile_ships_the_daemons_the_deployments_run():
    build, runtime = dockerfile_stages()
    shipped = set(re.search(r"for b in ([^;]+);", build).group(1).split())
    for pool, dep in deployments().items():
        assert main_container(dep)["command"][0] in shipped, pool
        uid = dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
        assert f"USER {uid}:" in runtime, pool
    assert (DEPLOY / "Dockerfile.dockerignore").is_file()


@pytest.mark.parametrize("daemon", sorted({"pd-router", "pd-prefill", "pd-decode"}))
def test_daemon_is_a_build_target(daemon: str):
    cmake = "\n".join(p.read_text() for p in REPO.glob("*/CMakeLists.txt"))
    assert daemon in cmake, f"{daemon} is not a CMake target: deploy/k8s runs it"
