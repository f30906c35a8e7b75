"""OpenVINO on the CPU: one static compiled shape per input size vs one dynamic H/W model, and a uint8 HWC input
with PrePostProcessor (convert, scale, layout inside the graph, what OvEngine does) vs a float32 CHW input (what the
ring holds for ONNX Runtime).

Run: ``python lab/openvino_shapes.py [MODEL] [--seconds S]`` (about 6 × S seconds plus compile time). Prints one line
per variant: frames per second with two infer requests in flight, one per worker thread, as the engine runs them.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import openvino as ov
from openvino.preprocess import PrePostProcessor


def _rate(compiled: ov.CompiledModel, frame: np.ndarray, seconds: float, requests: int = 2) -> float:
    count = [0] * requests
    stop = time.perf_counter() + seconds

    def loop(i: int) -> None:
        request = compiled.create_infer_request()
        while time.perf_counter() < stop:
            request.infer({0: frame}, share_inputs=True)
            count[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(count) / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="models/yolov3-tiny.onnx")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": args.precision, "NUM_STREAMS": 2, "PERFORMANCE_HINT": "THROUGHPUT"}
    h, w = 320, 416
    f32 = np.random.default_rng(0).random((1, 3, h, w), dtype=np.float32)
    u8 = (f32[0].transpose(1, 2, 0) * 255).astype(np.uint8)[None]

    static = core.read_model(args.model)
    static.reshape({0: [1, 3, h, w]})
    print(f"static 1x3x{h}x{w} float32: {_rate(core.compile_model(static, 'CPU', props), f32, args.seconds):.1f} fps")

    dynamic = core.read_model(args.model)
    dynamic.reshape({0: [1, 3, -1, -1]})
    print(f"dynamic 1x3x?x? float32 at {h}x{w}: "
          f"{_rate(core.compile_model(dynamic, 'CPU', props), f32, args.seconds):.1f} fps")

    model = core.read_model(args.model)
    model.reshape({0: [1, 3, h, w]})
    ppp = PrePostProcessor(model)
    ppp.input().tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC"))
    ppp.input().model().set_layout(ov.Layout("NCHW"))
    ppp.input().preprocess().convert_element_type(ov.Type.f32).scale(255.0)
    print(f"static uint8 NHWC + PrePostProcessor: "
          f"{_rate(core.compile_model(ppp.build(), 'CPU', props), u8, args.seconds):.1f} fps")
    f32_copy = np.empty_like(f32)

    def convert_then_rate() -> float:
        # what the float32 ring costs on top: the uint8 HWC → float32 CHW conversion the preprocess thread does
        t0 = time.perf_counter()
        for _ in range(200):
            np.multiply(u8[0].transpose(2, 0, 1), np.float32(1 / 255), out=f32_copy[0])
        return (time.perf_counter() - t0) / 200 * 1e3

    print(f"numpy uint8 HWC → float32 CHW conversion: {convert_then_rate():.2f} ms per frame (preprocess thread)")


if __name__ == "__main__":
    main()
