"""deploy/k8s against the Kubernetes API schema (kubernetes-validate, which ships the schemas: no cluster, no network).

Strict: a field the API does not know fails too. Validated for 1.28, the first release with the pod-index label
the StatefulSet reads, and for the newest release the validator knows. ``make test-containers`` installs the
validator with podman-compose; tests/unit/ops/test_k8s_manifests.py checks what a schema cannot (commands,
shards, ports that agree).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

try:
    import kubernetes_validate
except ImportError:  # outside `make test-containers`, which installs it; the tests then fail, not skip
    kubernetes_validate = None

pytestmark = pytest.mark.containers

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
DOCS = [(path.name, doc) for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
VERSIONS = ["1.28.0", kubernetes_validate.latest_version() if kubernetes_validate else "newest"]


@pytest.fixture(autouse=True)
def _validator():
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is not installed; `make test-containers` installs it")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCS])
def test_every_manifest_is_valid_for_the_kubernetes_api(name, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_an_unknown_field():
    statefulset = copy.deepcopy(next(doc for _, doc in DOCS if doc["kind"] == "StatefulSet"))
    statefulset["spec"]["template"]["spec"]["containers"][0]["prots"] = [{"containerPort": 9108}]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, VERSIONS[0], strict=True)
