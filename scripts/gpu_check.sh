#!/usr/bin/env bash
# One command for the day a GPU is lent: what runs on it, and how fast, written to one JSON and one log.
#
#   bash scripts/gpu_check.sh            # results in $OUT if set, else ./gpu-check/
#   bash scripts/gpu_check.sh --quick    # the same steps, short: checks the plumbing (e.g. on a CPU)
#
# On a bare GPU machine without network, carry the wheels (see docs/engines.md, "Checking a GPU"):
#   pip download -d shared/wheels -r <(python3 scripts/gpu_check.sh --requirements)   # on a networked machine
# and this script installs them with `pip install --no-index --find-links` into .venv-gpu. The model and
# clips come from $DETSTREAM_CACHE (carry ~/.cache/detstream/clips and models/yolov3-tiny.onnx).
# Steps, each bounded so the whole run stays within 10 minutes: install, `detstream doctor` (when the
# command exists), `pytest tests/gpu -ra`, the demo on every backend, and the bench's model-only,
# file-mode and eight-camera runs. Every step is recorded, pass or fail; the script exits 0 when it
# could record them all.
set -uo pipefail
cd "$(dirname "$0")/.."

requirements() {
    python3 - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["tensorrt"] + extras["dev"] + ["setuptools>=68", "wheel"]))
PY
}
if [[ "${1:-}" == "--requirements" ]]; then requirements; exit 0; fi
QUICK=()  # --quick: a smoke run of the plumbing (short demo, bench --quick); its numbers mean nothing
DEMO_S=20
if [[ "${1:-}" == "--quick" ]]; then QUICK=(--quick); DEMO_S=5; fi

OUT_DIR="${OUT:-$PWD/gpu-check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
STEPS="$OUT_DIR/.steps.tsv"
: > "$LOG"; : > "$STEPS"
WHEELS="${WHEELS:-}"
for candidate in shared/wheels .gpu-wheels; do
    [[ -z "$WHEELS" && -d "$candidate" ]] && WHEELS="$candidate"
done
PY="${PYTHON:-python3}"  # PYTHON: an interpreter that already has detstream's dependencies

step() {  # step NAME TIMEOUT_S COMMAND...: run, log, record name/rc/seconds
    local name=$1 limit=$2; shift 2
    echo "=== $name: $*" | tee -a "$LOG"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    local command="$*"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "${command//$'\n'/; }" >> "$STEPS"
    echo "=== $name: rc=$rc in $((SECONDS - start)) s" | tee -a "$LOG"
    return $rc
}

if [[ -n "$WHEELS" ]]; then
    step venv 60 python3 -m venv .venv-gpu && PY=.venv-gpu/bin/python
    step install 240 "$PY" -m pip install --no-index --find-links "$WHEELS" -r <(requirements)
elif [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then
    PY=.venv/bin/python
fi
export PYTHONPATH="$PWD"
DETSTREAM=("$PY" -m app)

step nvidia-smi 20 nvidia-smi
step versions 30 "$PY" -c "import importlib.metadata as m
for p in ('tensorrt', 'tensorrt-cu13', 'tensorrt-cu12', 'onnxruntime-gpu', 'onnxruntime', 'cuda-bindings', 'numpy'):
    try: print(p, m.version(p))
    except m.PackageNotFoundError: print(p, 'not installed')"
if "${DETSTREAM[@]}" doctor --help > /dev/null 2>&1; then
    step doctor 30 bash -c "$(printf '%q ' "${DETSTREAM[@]}") doctor --json > $(printf '%q' "$OUT_DIR/doctor.json")"
else
    echo "=== doctor: not in this detstream yet, skipped" | tee -a "$LOG"
fi
step pytest-gpu 240 "$PY" -m pytest tests/gpu -ra -p no:cacheprovider --junitxml "$OUT_DIR/pytest-gpu.xml"
VTEST="$("$PY" -c 'from app.assets import fetch_clip; print(fetch_clip("vtest.avi", None))' 2>> "$LOG")"
for backend in tensorrt onnxruntime; do
    step "demo-$backend" 60 "${DETSTREAM[@]}" run --engine "$backend" --source "cam0=$VTEST" --duration "$DEMO_S" --no-progress
done
step bench-model-file 150 "${DETSTREAM[@]}" bench "${QUICK[@]}" --only model,file --repeat 1 --frames 200 --model-seconds 10 \
    --json "$OUT_DIR/bench-model-file.json"
step bench-live-8 120 "${DETSTREAM[@]}" bench "${QUICK[@]}" --only live --cameras 8 --repeat 1 --duration 30 \
    --json "$OUT_DIR/bench-live-8.json"

"$PY" - "$OUT_DIR" "$LOG" <<'PY'
import json, pathlib, re, sys
out, log = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]).read_text(errors="replace")
steps = []
for line in (out / ".steps.tsv").read_text().splitlines():
    name, rc, seconds, command = line.split("\t", 3)
    steps.append({"step": name, "rc": int(rc), "seconds": int(seconds), "command": command})
def load(name):
    path = out / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
engines = sorted(set(re.findall(r"\b(tensorrt:(?:fp16|fp32|int8)|onnxruntime:\w+ExecutionProvider)", log)))
result = {"steps": steps, "backends_seen_in_log": engines, "doctor": load("doctor.json"),
          "bench_model_file": load("bench-model-file.json"), "bench_live_8": load("bench-live-8.json"),
          "log": "gpu_check.log"}
(out / "gpu_check.json").write_text(json.dumps(result, indent=2))
print(json.dumps({s["step"]: s["rc"] for s in steps}))
PY
rm -f "$STEPS"
