"""Static checks of deploy/k8s (no cluster here): valid commands per pod ordinal, the shard from the ordinal,
a config that validates, and endpoints, ports and names that agree across the manifests."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.cli import build_parser
from app.config import parse_config, shard_of
from app.runner import parse_shard

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
DOCS = [doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
POD_INDEX_LABEL = "metadata.labels['apps.kubernetes.io/pod-index']"


def one(kind: str, name: str | None = None) -> dict:
    found = [d for d in DOCS if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


STATEFULSET = one("StatefulSet")
WORKER = STATEFULSET["spec"]["template"]["spec"]["containers"][0]
PROXY_DEPLOYMENT = one("Deployment", "detstream-proxy")
PROXY = PROXY_DEPLOYMENT["spec"]["template"]["spec"]["containers"][0]
PROXY_SERVICE = one("Service", "detstream-proxy")


def parse_detstream(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as error:
        pytest.fail(f"`detstream {shlex.join(argv)}` is not a valid invocation (exit {error.code})")


def env_of(container: dict, ordinal: int) -> dict[str, str]:
    """The container's environment as the kubelet would build it for pod ``<name>-<ordinal>``."""
    env = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_INDEX_LABEL:
            env[item["name"]] = str(ordinal)
        elif "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = f"secret-{item['name'].lower()}"
    return env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion in args; an unknown $(VAR) would stay literal, which we refuse."""
    expanded = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]
    assert not any("$(" in a for a in expanded), expanded
    return expanded


def worker_args(ordinal: int) -> argparse.Namespace:
    assert "command" not in WORKER, "args only: the image's ENTRYPOINT is tini -- detstream"
    return parse_detstream(expand(WORKER["args"], env_of(WORKER, ordinal)))


def worker_config_text() -> str:
    args = worker_args(0)
    mount = next(m for m in WORKER["volumeMounts"] if args.config.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in STATEFULSET["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = one("ConfigMap", volume["configMap"]["name"])
    return config_map["data"][Path(args.config).relative_to(mount["mountPath"]).as_posix()]


def port_named(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def test_every_manifest_parses_and_names_its_kind():
    assert {d["kind"] for d in DOCS} == {"ConfigMap", "Service", "StatefulSet", "Deployment"}
    assert all(d.get("apiVersion") and d["metadata"].get("name") for d in DOCS)


def test_each_pod_ordinal_runs_its_own_shard_of_n_equal_to_replicas():
    replicas = STATEFULSET["spec"]["replicas"]
    shards = [parse_shard(worker_args(ordinal).shard) for ordinal in range(replicas)]
    assert shards == [(i, replicas) for i in range(replicas)]
    field_refs = [e["valueFrom"]["fieldRef"]["fieldPath"] for e in WORKER["env"]
                  if "fieldRef" in e.get("valueFrom", {})]
    assert POD_INDEX_LABEL in field_refs


def test_the_worker_config_validates_and_its_secrets_come_from_the_environment():
    text = worker_config_text()
    env = env_of(WORKER, 0)
    config = parse_config(yaml.safe_load(text), env=env)
    for name in set(re.findall(r"\$\{(\w+)\}", text)):
        item = next(e for e in WORKER["env"] if e["name"] == name)
        assert "secretKeyRef" in item["valueFrom"], f"${{{name}}} should come from a Secret"
    assert "secret-cam_password" in config.sources[0].url
    assert config.metrics.host == "0.0.0.0"


def test_every_shard_gets_cameras_and_every_camera_one_shard():
    config = parse_config(yaml.safe_load(worker_config_text()), env=env_of(WORKER, 0))
    replicas = STATEFULSET["spec"]["replicas"]
    owners = {s.id: shard_of(s.id, replicas) for s in config.sources}
    assert set(owners.values()) == set(range(replicas)), owners


def test_workers_publish_into_the_proxy_service_frontend():
    endpoint = worker_args(0).publish
    assert endpoint.startswith("connect+")
    parts = urlsplit(endpoint.removeprefix("connect+"))
    service_port = next(p for p in PROXY_SERVICE["spec"]["ports"] if p["port"] == parts.port)
    assert parts.hostname == PROXY_SERVICE["metadata"]["name"]
    assert service_port["name"] == "frontend"
    proxy = parse_detstream(PROXY["args"])
    assert urlsplit(proxy.frontend).port == port_named(PROXY, service_port["targetPort"])
    assert urlsplit(proxy.backend).port == port_named(PROXY, "backend")
    assert urlsplit(proxy.frontend).hostname == urlsplit(proxy.backend).hostname == "0.0.0.0"


def test_services_select_the_pods_they_front():
    for service, workload in ((PROXY_SERVICE, PROXY_DEPLOYMENT), (one("Service", STATEFULSET["spec"]["serviceName"]),
                                                                  STATEFULSET)):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_probes_and_scrape_annotations_use_the_metrics_port():
    port = worker_args(0).metrics_port
    assert port_named(WORKER, "metrics") == port
    probes = {kind: WORKER[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {p["port"] for p in probes.values()} == {"metrics"}
    assert probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz"
    annotations = STATEFULSET["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port) and annotations["prometheus.io/path"] == "/metrics"


def test_pods_run_as_the_image_user_with_data_on_a_volume():
    spec = STATEFULSET["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == 10001
    assert str(worker_args(0).models_dir).startswith("/data/")
    assert {"/data", "/tmp"} <= {m["mountPath"] for m in WORKER["volumeMounts"]}
    assert "data" in {t["metadata"]["name"] for t in STATEFULSET["spec"]["volumeClaimTemplates"]}
