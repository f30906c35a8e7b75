"""Command-line interface (docs/contract.md): parse arguments, then hand off to one module per command.

Every fatal error is one line on stderr naming what is wrong, and a non-zero
exit code: 2 for configuration/model/endpoint problems found before the run,
1 when the run ended with a failed source, 130 on a forced (second) signal.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from app.errors import DetstreamError
from app.stop import StopRequest

logger = logging.getLogger("detstream")

EXIT_CONFIG = 2


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the pipeline (no CONFIG: the built-in demo)")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--source", action="append", metavar="[ID=]URL",
                   help="replaces the config's sources; repeatable (rtsp://, http(s)://, file, /dev/videoN)")
    p.add_argument("--publish", metavar="ENDPOINT", help="e.g. tcp://127.0.0.1:5555 or connect+tcp://proxy:5556")
    p.add_argument("--model", metavar="NAME_OR_PATH", help="known model name or an .onnx path")
    p.add_argument("--engine", choices=["auto", "tensorrt", "onnxruntime", "openvino"])
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16", "int8"],
                   help="engine.precision (auto: fp16 on a GPU, bf16 on a CPU that computes it, else fp32)")
    p.add_argument("--max-batch", type=int, metavar="N")
    p.add_argument("--annotate", metavar="DIR", help="write annotated MP4s and JPEG snapshots here")
    p.add_argument("--realtime", action="store_true", help="pace files at their frame rate, like a camera")
    p.add_argument("--loop", action="store_true", help="restart files at the end (seq continues)")
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve /metrics, /healthz, /readyz")
    p.add_argument("--shard", metavar="I/N", help="take only the sources whose stable id hash falls in shard I")
    p.add_argument("--encoding", choices=["json", "msgpack"])
    p.add_argument("--tracking", choices=["none", "bytetrack"])
    p.add_argument("--models-dir", type=Path, default=Path("models"))
    p.add_argument("--no-progress", action="store_true", help="plain periodic log lines instead of a live line")
    p.add_argument("--log-format", dest="run_log_format", choices=["text", "json"], help="json: one object per line")


def _add_subscribe(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("subscribe", help="print messages from a publisher")
    p.add_argument("endpoint", nargs="?", default="tcp://127.0.0.1:5555")
    p.add_argument("--stream", action="append", default=[], metavar="ID", help="only this stream; repeatable")
    p.add_argument("--format", choices=["table", "json", "jsonl"], default="table")
    p.add_argument("--count", type=int, metavar="N", help="stop after N detection messages (events with --events)")
    p.add_argument("--events", action="store_true", help="zone and line events (event/<id>/) instead of detections")
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="stop after this long")
    p.add_argument("--out", type=Path, metavar="FILE.jsonl", help="also record every message here")


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="fetch or list models")
    msub = p.add_subparsers(dest="models_command", required=True)
    f = msub.add_parser("fetch", help="fetch and convert the default model into models/")
    f.add_argument("--models-dir", type=Path, default=Path("models"))
    f.add_argument("--clips", action="store_true", help="also fetch the demo/test clips into the cache")
    ls = msub.add_parser("list", help="list known models and where they are")
    ls.add_argument("--models-dir", type=Path, default=Path("models"))


def batch_range(text: str) -> tuple[int, int, int]:
    """``MIN:OPT:MAX`` batch sizes, 1 <= MIN <= OPT <= MAX (argparse reports the error and the command's usage)."""
    parts = text.split(":")
    try:
        low, opt, high = (int(part) for part in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN:OPT:MAX, whole numbers such as 1:4:8, got {text!r}") from None
    if not 1 <= low <= opt <= high:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= OPT <= MAX, got {text!r}")
    return low, opt, high


def _add_tools(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("build-engine", help="build and cache a TensorRT engine (needs an NVIDIA GPU)")
    b.add_argument("model", type=Path, help="the ONNX model to build from")
    b.add_argument("--fp16", action="store_true", help="build from the model's fp16 copy (made and cached)")
    b.add_argument("--int8", action="store_true",
                   help="build from <model>-int8.onnx (make it with: detstream quantize MODEL --calib FOOTAGE)")
    b.add_argument("--calib", type=Path, metavar="PATH_TO_FRAMES_OR_VIDEO",
                   help="not used: detstream quantize --calib calibrates the INT8 model")
    b.add_argument("--batch", default=(1, 4, 8), type=batch_range, metavar="MIN:OPT:MAX",
                   help="the batch sizes the engine's profiles cover (default: 1:4:8)")
    b.add_argument("--cache-dir", type=Path, help="default: ~/.cache/detstream/engines")

    q = sub.add_parser("quantize", help="make a static INT8 (QDQ) model calibrated on your footage, or an fp16 one")
    q.add_argument("model", type=Path, help="the fp32 ONNX model, e.g. models/yolov3-tiny.onnx")
    q.add_argument("--precision", choices=["int8", "fp16"], default="int8",
                   help="int8 (default): calibrated QDQ model; fp16: fp16 copy for GPUs (no calibration)")
    q.add_argument("--calib", type=Path, metavar="VIDEO_OR_DIR",
                   help="int8: a video or a folder of images from the cameras the model will watch (frames are "
                        "taken evenly over it); agreement with fp32 depends on it (docs/models.md)")
    q.add_argument("--out", type=Path,
                   help="where to write it (default: <model stem>-int8.onnx or -fp16.onnx beside the model)")
    q.add_argument("--frames", type=int, default=100, help="calibration frames (default: 100)")

    x = sub.add_parser("proxy", help="XSUB/XPUB fan-in: workers connect to the frontend, subscribers to the backend")
    x.add_argument("--frontend", default="tcp://127.0.0.1:5556")
    x.add_argument("--backend", default="tcp://127.0.0.1:5555")

    c = sub.add_parser("config", help="configuration tools")
    csub = c.add_subparsers(dest="config_command", required=True)
    check = csub.add_parser("check", help="validate a config and print it resolved, secrets masked")
    check.add_argument("file", type=Path)

    d = sub.add_parser("doctor", help="what this machine offers for inference and what `engine.backend: auto` picks")
    d.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    d.add_argument("--engine", choices=["auto", "tensorrt", "onnxruntime", "openvino"], default="auto",
                   help="the engine.backend to plan for (default: auto)")

    bench = sub.add_parser("bench", help="measure how many cameras this machine carries (see BENCHMARKS.md)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="bench options (detstream bench --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detstream", description="Streaming object detection over ZeroMQ.")
    parser.add_argument("--log-level", default=None, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="default INFO, or log.level of the run's config")
    parser.add_argument("--log-format", default=None, choices=["text", "json"])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_subscribe(sub)
    _add_models(sub)
    _add_tools(sub)
    return parser


def _dispatch(args: argparse.Namespace, stop: StopRequest | None = None) -> int:
    if args.command == "run":
        from app.runner import run_command

        return run_command(args, stop)
    if args.command == "subscribe":
        from app.subscribe.render import run_subscribe

        return run_subscribe(args.endpoint, args.stream, args.format, args.count, args.timeout, args.out,
                             events=args.events)
    if args.command == "models":
        from app.model_commands import models_command

        return models_command(args)
    if args.command == "build-engine":
        from app.config import TensorRTConfig
        from app.engines.tensorrt.prebuild import build_engine_main

        build_engine_main(args.model, fp16=args.fp16, int8=args.int8, calib=args.calib, batch=args.batch,
                          cache_dir=args.cache_dir or TensorRTConfig().engine_cache_dir, progress=True)
        return 0
    if args.command == "quantize":
        from app.models.quantization.quantize import quantize_command

        out = quantize_command(args.model, args.precision, args.calib, args.out, frames=args.frames)
        print(f"wrote {out}")
        return 0
    if args.command == "proxy":
        from app.publish.proxy import run_proxy

        run_proxy(args.frontend, args.backend)
        return 0
    if args.command == "config":
        from app.config import config_warnings, load_config, masked_dump

        config = load_config(args.file)
        for warning in config_warnings(config):
            logger.warning("%s", warning)
        print(masked_dump(config), end="")
        return 0
    if args.command == "doctor":
        from app.doctor import doctor_command

        return doctor_command(args.json, args.engine)
    if args.command == "bench":
        from app.bench import bench_command

        return bench_command(args.args[1:] if args.args[:1] == ["--"] else args.args)
    raise AssertionError(args.command)


GLOBAL_OPTIONS_WITH_VALUE = ("--log-level", "--log-format")


def bench_passthrough(argv: list[str]) -> list[str]:
    """Insert ``--`` after ``bench`` (after any global options) so every bench option reaches the bench.

    argparse's REMAINDER drops leading options, so ``detstream --log-level DEBUG bench --quick`` would
    otherwise fail with "unrecognized arguments".
    """
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in GLOBAL_OPTIONS_WITH_VALUE else 1
    if i < len(argv) and argv[i] == "bench" and argv[i + 1:i + 2] not in ([], ["--"]):
        return [*argv[:i + 1], "--", *argv[i + 1:]]
    return argv


def main(argv: list[str] | None = None, stop: StopRequest | None = None) -> int:
    """``stop``: signal handling installed before this module was imported (``python -m app``).

    ``run`` keeps it (a signal at any point of start-up is a stop request); every other command gets the
    previous handlers back (Ctrl-C is a KeyboardInterrupt), and a signal that came meanwhile is delivered again.
    """
    try:
        argv = bench_passthrough(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
    except BaseException:
        if stop is not None:
            stop.uninstall()
        raise
    if stop is not None and args.command != "run":
        stop.uninstall()
        stop = None
    from app.logs import setup_logging

    setup_logging(args.log_level or "INFO", getattr(args, "run_log_format", None) or args.log_format or "text")
    try:
        return _dispatch(args, stop)
    except DetstreamError as error:
        print(f"detstream: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
