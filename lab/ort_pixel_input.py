"""ONNX Runtime's CPU provider: would uint8 pixels with the conversion inside the graph beat the float32 ring?

The ring holds what an engine reads (``Engine.frame_format``). OpenVINO reads uint8 ``(H, W, 3)`` pixels and
converts them in its graph; this answers the same question for ONNX Runtime. It writes a copy of the model with
``Cast``, ``Mul`` (the model's pixel scale) and ``Transpose`` prepended, so that its input is uint8
``[N, H, W, 3]``, and times, on one thread each and interleaved, the decoder thread's numpy conversion plus the
float model against the uint8 model alone.

Run: ``python lab/ort_pixel_input.py [--model models/yolov3-tiny.onnx] [--height 320] [--width 416] [--runs 60]``
(about 10 s). Prints one line per round: milliseconds per frame for each side.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from app.models.spec import load_model_spec


def pixel_input_copy(model: Path, out: Path, scale: float) -> str:
    """Write ``model`` with uint8 NHWC input ``pixels`` converted in the graph; return the original input's name."""
    proto = onnx.load(str(model))
    graph = proto.graph
    name = graph.input[0].name
    for node in graph.node:
        node.input[:] = ["x_float" if value == name else value for value in node.input]
    graph.initializer.append(helper.make_tensor("pixel_scale", TensorProto.FLOAT, [], [scale]))
    prepended = [helper.make_node("Cast", ["pixels"], ["x_cast"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["x_cast", "pixel_scale"], ["x_scaled"]),
                 helper.make_node("Transpose", ["x_scaled"], ["x_float"], perm=[0, 3, 1, 2])]
    for node in reversed(prepended):
        graph.node.insert(0, node)
    graph.input.remove(graph.input[0])
    graph.input.insert(0, helper.make_tensor_value_info("pixels", TensorProto.UINT8, ["batch", "height", "width", 3]))
    onnx.save(proto, str(out))
    return name


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ms(run: Callable[[], object], count: int) -> float:
    for _ in range(3):
        run()
    started = time.perf_counter()
    for _ in range(count):
        run()
    return (time.perf_counter() - started) / count * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=Path("models/yolov3-tiny.onnx"))
    parser.add_argument("--height", type=int, default=320)
    parser.add_argument("--width", type=int, default=416)
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    spec = load_model_spec(args.model)
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "pixels.onnx"
        name = pixel_input_copy(args.model, copy, spec.scale)
        floats, pixels_model = _session(args.model), _session(copy)
        pixels = np.random.default_rng(0).integers(0, 256, (1, args.height, args.width, 3), dtype=np.uint8)
        tensor = np.empty((1, 3, args.height, args.width), np.float32)
        scale = np.float32(spec.scale)

        def convert() -> None:  # what the decoder thread does for a float32 slot (app.preprocess.letterbox_into)
            for channel in range(3):
                np.multiply(pixels[0, :, :, channel], scale, out=tensor[0, channel], casting="unsafe")

        for _ in range(3):
            conversion = _ms(convert, 5 * args.runs)
            float_model = _ms(lambda: floats.run(None, {name: tensor}), args.runs)
            pixel_model = _ms(lambda: pixels_model.run(None, {"pixels": pixels}), args.runs)
            print(f"float32 ring: numpy conversion {conversion:.2f} ms + model {float_model:.2f} ms = "
                  f"{conversion + float_model:.2f} ms | uint8 ring: model with the conversion inside "
                  f"{pixel_model:.2f} ms  ({args.width}x{args.height}, one thread)", flush=True)


if __name__ == "__main__":
    main()
