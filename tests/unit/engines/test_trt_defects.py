"""The TensorRT path against fakes as strict as TensorRT and CUDA: each test is one defect a real GPU would hit.

Addresses aligned to 256 bytes per static-batch step, a profile per concurrently used context, the sticky
last error after a failed graph capture, outputs matched by name, extra inputs refused, close() that frees
nothing a consumer still reads and releases contexts and engine, precision taken from the model file.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import onnx
import pytest
from engine_fakes import FakeTrtRuntime
from engine_models import make_model, random_frames, reference
from host_device import HostDevice

from app.config import EngineConfig
from app.engines.tensorrt import open_tensorrt_engine
from app.engines.tensorrt.precision import model_for_precision, trt_precision
from app.engines.tensorrt.scheduler import TENSOR_ALIGNMENT, BatchLayout, aligned, device_bytes
from app.errors import EngineError, EngineLoadError
from app.models.store.files import sha256_file
from app.models.store.provenance import QUANTIZED_FROM, QUANTIZER_VERSION, QUANTIZER_VERSION_KEY


def _open(tmp_path: Path, device: HostDevice, runtime: FakeTrtRuntime, *, batch: int | None = None,
          dynamic_hw: bool = False, contexts: int = 2, precision: str = "fp16", max_batch: int = 4, **tensorrt):
    spec = make_model(tmp_path / f"tiny-{batch}-{dynamic_hw}.onnx", batch, dynamic_hw=dynamic_hw)
    config = EngineConfig(max_batch=max_batch, precision=precision, tensorrt={"contexts": contexts, **tensorrt})
    return open_tensorrt_engine(spec, config, device, runtime, tmp_path / "cache")


def _check(engine, n: int, seed: int = 0) -> None:
    frames = random_frames(n, seed=seed)
    outputs = engine.submit(list(frames)).wait()
    for got, want in zip(outputs, reference(frames), strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_alignment_helpers() -> None:
    assert aligned(1) == TENSOR_ALIGNMENT and aligned(256) == 256 and aligned(257) == 512
    assert device_bytes(5, 12, None) == 60
    assert device_bytes(6, 12, 2) == 3 * 256  # three steps, each an aligned block


def test_batch_layout_puts_static_batch_steps_at_aligned_blocks() -> None:
    def layout(static_batch: int | None) -> BatchLayout:
        return BatchLayout("images", (3, 2, 2), np.dtype(np.float32), ("out",), (20,), (2,), static_batch)

    packed, steps = layout(None), layout(2)
    assert packed.frame_bytes == steps.frame_bytes == 48
    assert [packed.frame_offset(i) for i in range(3)] == [0, 48, 96]
    assert [steps.frame_offset(i) for i in range(3)] == [0, 48, 256]  # frame 2 opens the second step
    assert (packed.input_device_bytes(3), packed.output_device_bytes(3)) == (144, [60])
    assert (steps.input_device_bytes(3), steps.output_device_bytes(3)) == (512, [512])


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_static_batch_steps_get_256_byte_aligned_addresses(tmp_path: Path, device: HostDevice, n: int) -> None:
    # A row of "pooled" is 12 bytes: step 1 of a batch-2 engine at 24 bytes in would be refused.
    engine = _open(tmp_path, device, FakeTrtRuntime(device), batch=2, cuda_graphs=False)
    try:
        _check(engine, n, seed=n)
    finally:
        engine.close()


def test_each_context_of_a_fixed_batch_open_size_engine_has_its_own_profile(tmp_path: Path,
                                                                          device: HostDevice) -> None:
    # batch fixed at 1, height and width open: a dynamic-shape engine, so two contexts need two profiles
    engine = _open(tmp_path, device, FakeTrtRuntime(device), batch=1, dynamic_hw=True, max_batch=1)
    try:
        for seed in range(4):
            _check(engine, 1, seed=seed)
        assert [slot.profile for slot in engine._scheduler.slots] == [0, 1]
    finally:
        engine.close()


def test_two_live_contexts_on_one_profile_are_refused_by_the_fake(tmp_path: Path, device: HostDevice) -> None:
    runtime = FakeTrtRuntime(device)
    spec = make_model(tmp_path / "tiny.onnx", None)
    from app.engines.tensorrt.runtime import BuildOptions

    blob = runtime.build(Path(spec.path), BuildOptions("images", (8, 8), "fp32", ((1, 4, 4),), contexts=2))
    model = runtime.deserialize(blob)
    first, second = model.create_context(), model.create_context()
    first.set_optimization_profile(0, None)
    with pytest.raises(EngineError, match="in use by another execution context"):
        second.set_optimization_profile(0, None)
    second.set_optimization_profile(1, None)
    with pytest.raises(EngineError, match="outside profile 1"):
        second.set_input_shape("images", (5, 3, 8, 8))
    first.release()
    second.set_optimization_profile(0, None)  # free again once the first context is destroyed


def test_a_failed_capture_clears_the_leftover_cuda_error_so_plain_enqueue_goes_on(tmp_path: Path) -> None:
    dev = HostDevice(fail_on={"capture": 1})
    try:
        engine = _open(tmp_path, dev, FakeTrtRuntime(dev))
        try:
            for seed in range(4):
                _check(engine, 1 + seed % 3, seed=seed)
            assert dev.peek_last_error() is None
        finally:
            engine.close()
    finally:
        dev.close()


def test_capturing_a_shape_that_never_ran_plainly_is_refused_by_the_fake(tmp_path: Path, device: HostDevice) -> None:
    runtime = FakeTrtRuntime(device)
    spec = make_model(tmp_path / "tiny.onnx", 2)
    from app.engines.tensorrt.runtime import BuildOptions

    context = runtime.deserialize(runtime.build(Path(spec.path), BuildOptions("images", (8, 8), "fp32",
                                                                             ((2, 2, 2),)))).create_context()
    context.set_input_shape("images", (2, 3, 8, 8))
    for name in ("images", "pooled", "scaled"):
        context.set_tensor_address(name, device.malloc(2 * 3 * 8 * 8 * 4))
    stream = device.stream_create()
    device.stream_begin_capture(stream)
    with pytest.raises(EngineError, match="never ran uncaptured"):
        context.execute(stream)
    device.stream_end_capture(stream)
    assert device.clear_last_error() == "cudaErrorStreamCaptureInvalidated"
    with pytest.raises(EngineError, match="not 256-byte aligned"):
        context.set_tensor_address("images", device.malloc(64) + 12)


def test_a_fault_on_one_stream_poisons_every_stream_of_the_device(device: HostDevice) -> None:
    a, b = device.stream_create(), device.stream_create()
    device.enqueue(a, lambda: 1 / 0, kind="execute")
    done_a, done_b = device.event_create(), device.event_create()
    device.event_record(done_a, a)
    with pytest.raises(EngineError):
        device.event_synchronize(done_a)
    device.event_record(done_b, b)
    with pytest.raises(EngineError, match="earlier work"):
        device.event_synchronize(done_b)
    with pytest.raises(EngineError, match="sticky error"):
        device.malloc(16)


def test_outputs_come_back_in_the_models_order_whatever_order_the_engine_lists(tmp_path: Path,
                                                                               device: HostDevice) -> None:
    engine = _open(tmp_path, device, FakeTrtRuntime(device, reverse_outputs=True))
    try:
        _check(engine, 3)
    finally:
        engine.close()


def test_an_engine_input_the_pipeline_does_not_feed_is_refused(tmp_path: Path, device: HostDevice) -> None:
    with pytest.raises(EngineLoadError, match=r"inputs \['scale'\] besides the image input 'images'"):
        _open(tmp_path, device, FakeTrtRuntime(device, extra_input="scale"))


def test_close_releases_contexts_and_engine(tmp_path: Path, device: HostDevice) -> None:
    runtime = FakeTrtRuntime(device)
    engine = _open(tmp_path, device, runtime)
    contexts = [slot.context for slot in engine._scheduler.slots]
    engine.close()
    assert all(c.released for c in contexts) and runtime.models[-1].released


def test_close_keeps_the_outputs_a_consumer_still_reads_until_it_drops_them(tmp_path: Path,
                                                                            device: HostDevice) -> None:
    engine = _open(tmp_path, device, FakeTrtRuntime(device))
    frames = random_frames(3, seed=7)
    held = engine.submit(list(frames)).wait()  # the results thread holds these views...
    expected = [o.copy() for o in held]
    pinned_before = len(device._host_blocks)
    engine.close()  # ...when the pipeline closes the engine
    assert len(device._host_blocks) >= len(held) and pinned_before > len(device._host_blocks)
    addresses = {o.__array_interface__["data"][0] for o in held}
    assert all(any(base <= a < base + block.nbytes for base, block in device._host_blocks.items())
               for a in addresses), "a held output view points into freed host memory"
    for got, want in zip(held, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    del held, got
    gc.collect()
    assert device._host_blocks == {}


def _precision_of(path: Path) -> str | None:
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return meta.get("detstream.precision")


@pytest.mark.parametrize("precision", ["fp16", "auto"])
def test_fp16_and_auto_build_from_the_fp16_model(tmp_path: Path, device: HostDevice, precision: str) -> None:
    runtime = FakeTrtRuntime(device)
    if precision == "auto":  # until engine.precision accepts auto, through the mapping the engine uses
        assert trt_precision("auto") == "fp16"
        precision = trt_precision("auto")
    engine = _open(tmp_path, device, runtime, precision=precision)
    try:
        (source,) = runtime.built_from
        assert _precision_of(source) == "fp16" and source.parent == tmp_path / "cache" / "models"
        assert engine.backend == "tensorrt:fp16"
        _check(engine, 2)
    finally:
        engine.close()


def test_int8_builds_from_the_quantized_model_beside_it_and_says_how_to_make_it(tmp_path: Path,
                                                                              device: HostDevice) -> None:
    spec = make_model(tmp_path / "tiny.onnx", None)
    with pytest.raises(EngineLoadError, match=r"detstream quantize .*tiny\.onnx --calib"):
        model_for_precision(Path(spec.path), "int8", tmp_path / "cache")
    int8 = tmp_path / "tiny-int8.onnx"
    model = onnx.load(spec.path)
    onnx.helper.set_model_props(model, {QUANTIZED_FROM: "0" * 64, QUANTIZER_VERSION_KEY: QUANTIZER_VERSION})
    onnx.save(model, str(int8))
    with pytest.raises(EngineLoadError, match=r"stale .*remake it with: detstream quantize"):
        model_for_precision(Path(spec.path), "int8", tmp_path / "cache")
    onnx.helper.set_model_props(model, {QUANTIZED_FROM: sha256_file(Path(spec.path)),
                                        QUANTIZER_VERSION_KEY: QUANTIZER_VERSION})
    onnx.save(model, str(int8))
    runtime = FakeTrtRuntime(device)
    config = EngineConfig(max_batch=4, precision="int8", tensorrt={"contexts": 2})
    engine = open_tensorrt_engine(spec, config, device, runtime, tmp_path / "cache")
    try:
        assert runtime.built_from == [int8] and engine.backend == "tensorrt:int8"
    finally:
        engine.close()
    assert model_for_precision(Path(spec.path), "fp32", tmp_path / "cache") == Path(spec.path)
    assert model_for_precision(int8, "int8", tmp_path / "cache") == int8  # configured as the model itself


def test_bf16_is_refused_with_what_to_set_instead() -> None:
    with pytest.raises(EngineLoadError, match="runs fp16, not bf16"):
        trt_precision("bf16")


def test_onnxruntimes_cuda_provider_loads_the_fp16_model_for_fp16_and_auto(tmp_path: Path) -> None:
    from app.engines.onnxruntime.session import model_file

    spec = make_model(tmp_path / "tiny.onnx", None)
    for precision in ("fp16", "auto"):
        chosen = Path(model_file(spec, precision, "CUDAExecutionProvider", tmp_path / "cache"))
        assert chosen.parent == tmp_path / "cache" / "models" and _precision_of(chosen) == "fp16"
    assert model_file(spec, "fp32", "CUDAExecutionProvider", tmp_path / "cache") == spec.path
    assert model_file(spec, "fp16", "CPUExecutionProvider", tmp_path / "cache") == spec.path
    assert model_file(spec, "fp16", "TensorrtExecutionProvider", tmp_path / "cache") == spec.path
