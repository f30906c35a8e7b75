"""Every TensorRT name the adapter, the builder and the fake module use exists in the real TensorRT 11 and 10.

Runtime classes (``Runtime``, ``ICudaEngine``, ``IExecutionContext``, ``IOptimizationProfile``,
``ITimingCache``, enums) are checked member by member, with parameter names, against the real lean
bindings imported in a subprocess; builder-side classes (``Builder``, ``IBuilderConfig``,
``INetworkDefinition``, ``OnnxParser``), which only the full library can import, against the names and
keywords in the full bindings' ``.so``. A method the code calls that the real API lacks, a keyword it does
not take, or a fake that drifts from the real signatures fails here.
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from api_usage import MODULE, TRT_SOURCES, TRT_VARIABLES, uses
from real_bindings import BindingNames

FAKE = Path(__file__).resolve().parents[1] / "unit" / "engines" / "fake_trt_module.py"
BUILDER_SIDE = {"Builder", "IBuilderConfig", "INetworkDefinition", "OnnxParser", "NetworkDefinitionCreationFlag"}
FAKE_CLASSES = {  # the fake's class name -> the real class it stands for
    "Builder": "Builder", "Network": "INetworkDefinition", "Profile": "IOptimizationProfile",
    "TimingCache": "ITimingCache", "Config": "IBuilderConfig", "HostMemory": "IHostMemory",
    "OnnxParser": "OnnxParser", "Context": "IExecutionContext", "CudaEngine": "ICudaEngine", "Runtime": "Runtime",
    "ILogger": "ILogger", "IProgressMonitor": "IProgressMonitor",
}
FAKE_ONLY = {"calls", "__version__"}


def _fake_module(major: int):
    spec = importlib.util.spec_from_file_location("fake_trt_module_conformance", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, module.make_module(version=f"{major}.0.0")


def _fake_objects(fake) -> dict[str, object]:
    """One instance of each fake class, made the way the adapters make the real ones."""
    logger = fake.ILogger()
    builder = fake.Builder(logger)
    network = builder.create_network(0)
    config = builder.create_builder_config()
    engine = fake.Runtime(logger).deserialize_cuda_engine(b"plan")
    return {
        "Builder": builder, "Network": network, "Config": config, "Profile": builder.create_optimization_profile(),
        "TimingCache": config.create_timing_cache(b""), "HostMemory": builder.build_serialized_network(network, config),
        "OnnxParser": fake.OnnxParser(network, logger), "Runtime": fake.Runtime(logger), "CudaEngine": engine,
        "Context": engine.create_execution_context(), "ILogger": logger, "IProgressMonitor": fake.IProgressMonitor(),
    }


def _problem_with(use_owner: str, member: str, api: dict, strings: BindingNames, *, call: bool = False,
                  positional: int = 0, keywords: tuple[str, ...] = ()) -> str | None:
    """Why ``owner.member`` (called so) does not exist in the real TensorRT, or None."""
    classes, enums = api["classes"], api["enums"]
    if use_owner == MODULE:
        if member == "__version__" or member in classes or member in api["functions"]:
            return None
        return None if member in BUILDER_SIDE and member in strings else f"no trt.{member}"
    if use_owner in enums and use_owner not in BUILDER_SIDE:
        return None if member in enums[use_owner] or member in classes.get(use_owner, {}) else \
            f"no {use_owner}.{member} (members: {', '.join(enums[use_owner])})"
    if use_owner in classes and use_owner not in BUILDER_SIDE:
        info = classes[use_owner].get(member)
        if info is None:
            return f"no {use_owner}.{member}"
        if member == "__init__" and positional:
            positional -= 1  # Base.__init__(self): self passed explicitly
        if call and info["kind"] == "method" and info["params"]:
            fits = [p for p in info["params"] if set(keywords) <= set(p) and positional + len(keywords) <= len(p)]
            if not fits:
                return f"{use_owner}.{member} takes {info['params']}, called with {positional} positional + {keywords}"
        return None
    missing = [name for name in (member, *keywords) if name not in strings]
    return f"{use_owner}: {missing} not in the real bindings" if missing else None


def test_every_name_the_adapter_and_builder_use_exists_in_the_real_tensorrt(real_trt) -> None:
    _, api, strings = real_trt
    found = uses(TRT_SOURCES, TRT_VARIABLES)
    assert {u.member for u in found} >= {"set_optimization_profile_async", "execute_async_v3", "create_network",
                                         "STRONGLY_TYPED", "add_optimization_profile", "set_timing_cache"}
    problems = [f"{u.where}: {why}" for u in found
                if (why := _problem_with(u.owner, u.member, api, strings, call=u.call, positional=u.positional,
                                         keywords=u.keywords))]
    assert not problems, f"TensorRT {api['version']}:\n" + "\n".join(problems)


def test_the_fake_modules_names_and_parameters_are_the_real_ones(real_trt) -> None:
    major, api, strings = real_trt
    _, fake = _fake_module(major)
    problems = []
    for name in sorted(set(vars(fake)) - FAKE_ONLY):
        if why := _problem_with(MODULE, name, api, strings):
            problems.append(why)
    for group in ("BuilderFlag", "MemoryPoolType"):
        for member in vars(getattr(fake, group)):
            if why := _problem_with(group, member, api, strings):
                problems.append(why)
    for enum_name, enum in (("TensorIOMode", fake.TensorIOMode), ("ILogger.Severity", fake.ILogger.Severity),
                            ("NetworkDefinitionCreationFlag", fake.NetworkDefinitionCreationFlag)):
        for member in enum.__members__:
            if why := _problem_with(enum_name, member, api, strings):
                problems.append(why)
    for fake_name, obj in _fake_objects(fake).items():
        real = FAKE_CLASSES[fake_name]
        for member, value in vars(type(obj)).items():
            if member.startswith("_") or not callable(value):
                continue
            params = [p for p in inspect.signature(value).parameters if p != "self"]
            info = api["classes"].get(real, {}).get(member) if real not in BUILDER_SIDE else None
            if info is not None and info.get("params") and params not in info["params"]:
                problems.append(f"fake {fake_name}.{member}{tuple(params)}: real {real}.{member} "
                                f"takes {info['params']}")
            elif info is None and (why := _problem_with(real, member, api, strings, keywords=tuple(params))):
                problems.append(f"fake {fake_name}: {why}")
    assert not problems, f"TensorRT {api['version']}:\n" + "\n".join(problems)


def test_tensorrt_11_has_no_fp16_or_int8_builder_flags_and_the_fake_agrees(real_trt) -> None:
    major, api, _ = real_trt
    _, fake = _fake_module(major)
    real_flags, fake_flags = set(api["enums"]["BuilderFlag"]), set(vars(fake.BuilderFlag))
    assert fake_flags <= real_flags
    assert ({"FP16", "INT8"} <= real_flags) == (major == 10) == ({"FP16", "INT8"} <= fake_flags)


def test_set_optimization_profile_async_is_documented_to_return_true(real_trt) -> None:
    _, api, _ = real_trt
    assert api["classes"]["IExecutionContext"]["set_optimization_profile_async"]["params"] == [
        ["profile_index", "stream_handle"]]
