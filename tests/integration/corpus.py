"""The bad-input corpus: builders that make broken inputs in a temporary directory, and what each must do.

Nothing here is committed as data: every input is made by ffmpeg or Python at
test time (a few seconds for the whole corpus). Three tables:

* :data:`FILE_CASES`: file sources. They all run in ONE ``detstream run``
  beside a good 20-frame clip; each must end with the given final state and a
  reason matching the regex, and the good clip must publish all its frames.
* :data:`NET_CASES`: network sources that retry (a wrong RTSP path, a wrong
  password, nothing listening, a server that answers garbage, HTTP 404 ...).
  They run in ONE ``detstream run --duration`` beside the good clip; each
  must publish ``reconnecting`` with a reason matching the regex and no
  detection, and must not stop the good clip.
* :data:`FATAL_CASES`: configuration, model and endpoint mistakes. Each is a
  ``detstream run`` that must exit 2 at once with exactly one
  ``detstream: error:`` line matching the regex, and no traceback.

``docs/reliability.md`` shows these tables; :func:`markdown_table` prints
them so the document can be checked against the code.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

GOOD_FRAMES = 20


@dataclass
class Context:
    """Where builders put files, and the servers network cases point at (None when not needed)."""

    root: Path
    rtsp_port: int = 0          # a GStreamer RTSP server with /cam, user "viewer", password "right"
    garbage_port: int = 0       # answers anything with bytes that are not RTSP
    http_base: str = ""         # a loopback HTTP server serving ``root``
    dead_port: int = 0          # nothing listening
    busy_port: int = 0          # a port some other socket has bound
    model: Path | None = None   # the real default model (for cases that damage it)
    extra: dict[str, str] = field(default_factory=dict)


Builder = Callable[[Context], str]


@dataclass(frozen=True)
class SourceCase:
    """A source that must not take the others down.

    ``frames``: ``(low, high)`` bounds on the detection messages it publishes
    (``high`` None: no upper bound). Published seqs must always be 0..n-1.
    """

    id: str
    build: Builder
    state: str                 # final status: failed | ended (files); reconnecting (network, last seen)
    reason: str                # regex searched in the final (files) / reconnecting (network) reason
    frames: tuple[int, int | None] = (0, 0)
    what: str = ""
    bug: str = ""              # set while a known bug makes the case fail: the test is a strict xfail


@dataclass(frozen=True)
class FatalCase:
    """``detstream run`` arguments (built) that must fail fast with one clear line."""

    id: str
    args: Callable[[Context], list[str]]
    error: str                 # regex searched in the single ``detstream: error:`` line
    what: str = ""
    bug: str = ""              # set while a known bug makes the case fail: the test is a strict xfail
    absent: str = ""           # a secret that must appear nowhere in the output


# -- helpers ---------------------------------------------------------------------------------------------------------

def ffmpeg(*args: str, timeout_s: float = 60) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-nostdin", *args], check=True, capture_output=True,
                   timeout=timeout_s)


def testsrc(size: str = "320x240", rate: int = 10) -> list[str]:
    return ["-f", "lavfi", "-i", f"testsrc=size={size}:rate={rate}"]


def h264(path: Path, frames: int, *, size: str = "320x240", rate: int = 10, gop: int = 10,
         faststart: bool = True, extra: tuple[str, ...] = ()) -> Path:
    if not path.exists():
        args = [*testsrc(size, rate), "-frames:v", str(frames), "-c:v", "libx264", "-preset", "ultrafast",
                "-pix_fmt", "yuv420p", "-g", str(gop), "-bf", "0", *extra]
        if faststart and path.suffix == ".mp4":
            args += ["-movflags", "+faststart"]
        ffmpeg(*args, str(path))
    return path


def good_clip(ctx: Context) -> Path:
    return h264(ctx.root / "good.mp4", GOOD_FRAMES)


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


# -- file builders ---------------------------------------------------------------------------------------------------

def missing(ctx: Context) -> str:
    return str(ctx.root / "no_such_clip.mp4")


def directory(ctx: Context) -> str:
    (ctx.root / "a_directory.mp4").mkdir(exist_ok=True)
    return str(ctx.root / "a_directory.mp4")


def empty(ctx: Context) -> str:
    return _write(ctx.root / "empty.mp4", b"")


def random_bytes(ctx: Context) -> str:
    return _write(ctx.root / "random.mp4", random.Random(7).randbytes(200_000))


def text_avi(ctx: Context) -> str:
    return _write(ctx.root / "notes.avi", b"this is a shopping list, not a video\n" * 100)


def html_mp4(ctx: Context) -> str:
    return _write(ctx.root / "page.mp4", b"<!doctype html><html><body>404 Not Found</body></html>\n" * 20)


def fifo(ctx: Context) -> str:
    path = ctx.root / "pipe.mp4"
    if not path.exists():
        os.mkfifo(path)
    return str(path)


def file_url_missing(ctx: Context) -> str:
    return f"file://{ctx.root}/gone.mp4"


def moov_missing(ctx: Context) -> str:
    """moov at the end, file cut in half: the index never arrives."""
    whole = h264(ctx.root / "moov_last_src.mp4", 60, faststart=False).read_bytes()
    return _write(ctx.root / "moov_missing.mp4", whole[: len(whole) // 2])


def truncated_mid_stream(ctx: Context) -> str:
    """moov first, then cut at 40 %: the first frames are whole, the index promises 30."""
    whole = h264(ctx.root / "moov_first_src.mp4", 30).read_bytes()
    return _write(ctx.root / "truncated.mp4", whole[: int(len(whole) * 0.4)])


def _ts_packets_of_frames(data: bytes) -> list[int]:
    """Offsets of the 188-byte TS packets that start a PES packet of the video PID (one per frame)."""
    starts = []
    for offset in range(0, len(data) - 188 + 1, 188):
        pusi = data[offset + 1] & 0x40
        pid = ((data[offset + 1] & 0x1F) << 8) | data[offset + 2]
        if data[offset] == 0x47 and pusi and pid == 0x100:
            starts.append(offset)
    return starts


def corrupt_nal_units(ctx: Context) -> str:
    """30 frames, GOP 10, MPEG-TS; the slice data of frames 13..16 overwritten with garbage."""
    src = h264(ctx.root / "nal_src.ts", 30, extra=("-mpegts_start_pid", "0x100"))
    data = bytearray(src.read_bytes())
    rng = random.Random(11)
    starts = _ts_packets_of_frames(bytes(data))
    for frame in range(13, 17):
        begin = starts[frame] + 188  # keep the PES header packet, wreck the following ones of this frame
        end = starts[frame + 1] if frame + 1 < len(starts) else len(data)
        for offset in range(begin, end, 188):
            if data[offset] == 0x47 and (((data[offset + 1] & 0x1F) << 8) | data[offset + 2]) == 0x100:
                data[offset + 8: offset + 188] = rng.randbytes(180)
    return _write(ctx.root / "corrupt_nal.ts", bytes(data))


def zeroed_mdat(ctx: Context) -> str:
    """A valid index over frame data that is all zero bytes."""
    data = bytearray(h264(ctx.root / "zero_src.mp4", 30).read_bytes())
    at = data.find(b"mdat")
    size = struct.unpack(">I", data[at - 4: at])[0]
    data[at + 4: at - 4 + size] = bytes(size - 8)
    return _write(ctx.root / "zeroed_mdat.mp4", bytes(data))


def audio_only(ctx: Context) -> str:
    path = ctx.root / "audio.m4a"
    ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=2", "-c:a", "aac", str(path))
    return str(path)


def subtitles_only(ctx: Context) -> str:
    srt = ctx.root / "subs.srt"
    srt.write_text("1\n00:00:00,000 --> 00:00:02,000\nhello\n\n2\n00:00:02,000 --> 00:00:04,000\nworld\n")
    path = ctx.root / "subs.mkv"
    ffmpeg("-i", str(srt), "-c:s", "srt", str(path))
    return str(path)


def png_still(ctx: Context) -> str:
    path = ctx.root / "still.png"
    ffmpeg(*testsrc("320x240"), "-frames:v", "1", str(path))
    return str(path)


def jpeg_still(ctx: Context) -> str:
    path = ctx.root / "still.jpg"
    ffmpeg(*testsrc("320x240"), "-frames:v", "1", str(path))
    return str(path)


def gif(ctx: Context) -> str:
    path = ctx.root / "anim.gif"
    ffmpeg(*testsrc("160x120", 5), "-frames:v", "4", str(path))
    return str(path)


def raw_h264(ctx: Context) -> str:
    """An Annex B elementary stream: no container, no timestamps at all."""
    path = ctx.root / "raw.h264"
    ffmpeg(*testsrc(), "-frames:v", "8", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0", "-f", "h264",
           str(path))
    return str(path)


def timestamp_jumps(ctx: Context) -> str:
    """Three 5-frame MPEG-TS pieces joined byte-wise: time jumps 10 hours ahead, then back to the start."""
    path = ctx.root / "ts_jumps.ts"
    if not path.exists():
        first, ahead = ctx.root / "jump_a.ts", ctx.root / "jump_b.ts"
        h264(first, 5)
        if not ahead.exists():
            ffmpeg(*testsrc(), "-frames:v", "5", "-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p",
                   "-g", "10", "-bf", "0", "-output_ts_offset", "36000", str(ahead))
        path.write_bytes(first.read_bytes() + ahead.read_bytes() + first.read_bytes())
    return str(path)


def zero_fps(ctx: Context) -> str:
    """Every frame at timestamp 0: no frame rate can be derived."""
    path = ctx.root / "zero_fps.mkv"
    ffmpeg(*testsrc(), "-frames:v", "5", "-c:v", "libx264", "-preset", "ultrafast", "-bf", "0",
           "-bsf:v", "setts=ts=0", str(path))
    return str(path)


def huge_8k(ctx: Context) -> str:
    path = ctx.root / "huge_8k.mp4"
    ffmpeg(*testsrc("7680x4320", 1), "-frames:v", "2", "-c:v", "libx264", "-preset", "ultrafast",
           "-pix_fmt", "yuv420p", str(path), timeout_s=120)
    return str(path)


def one_pixel(ctx: Context) -> str:
    path = ctx.root / "one_pixel.mkv"
    ffmpeg(*testsrc("1x1"), "-frames:v", "3", "-c:v", "ffv1", str(path))
    return str(path)


def thin_strip(ctx: Context) -> str:
    """2 pixels wide, 1000 high: scales to less than one input pixel across."""
    path = ctx.root / "thin_strip.mkv"
    ffmpeg(*testsrc("2x1000"), "-frames:v", "3", "-c:v", "ffv1", str(path))
    return str(path)


def gray16(ctx: Context) -> str:
    path = ctx.root / "gray16.mkv"
    ffmpeg(*testsrc(), "-frames:v", "3", "-c:v", "ffv1", "-pix_fmt", "gray16le", str(path))
    return str(path)


def hevc_10bit(ctx: Context) -> str:
    path = ctx.root / "hevc10.mp4"
    ffmpeg(*testsrc(), "-frames:v", "3", "-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p10le",
           "-x265-params", "log-level=error", str(path))
    return str(path)


def unknown_fourcc(ctx: Context) -> str:
    """An AVI whose codec tag says ZZZZ: FFmpeg has no decoder for it."""
    src = ctx.root / "fourcc_src.avi"
    ffmpeg(*testsrc(), "-frames:v", "5", "-c:v", "mpeg4", "-vtag", "XVID", str(src))
    return _write(ctx.root / "unknown_fourcc.avi", src.read_bytes().replace(b"XVID", b"ZZZZ"))


def unicode_name(ctx: Context) -> str:
    path = ctx.root / "caméra d'entrée #1 (copy).mp4"
    h264(path, 3)
    return str(path)


# -- network builders ------------------------------------------------------------------------------------------------

def rtsp_wrong_path(ctx: Context) -> str:
    return f"rtsp://viewer:right@127.0.0.1:{ctx.rtsp_port}/no_such_mount"


def rtsp_wrong_password(ctx: Context) -> str:
    return f"rtsp://viewer:wrong@127.0.0.1:{ctx.rtsp_port}/cam"


def rtsp_no_credentials(ctx: Context) -> str:
    return f"rtsp://127.0.0.1:{ctx.rtsp_port}/cam"


def rtsp_refused(ctx: Context) -> str:
    return f"rtsp://127.0.0.1:{ctx.dead_port}/cam"


def rtsp_garbage(ctx: Context) -> str:
    return f"rtsp://127.0.0.1:{ctx.garbage_port}/cam"


def http_404(ctx: Context) -> str:
    return f"{ctx.http_base}/not_here.mp4"


def http_not_video(ctx: Context) -> str:
    (ctx.root / "index.html").write_text("<html><body>a camera login page</body></html>\n" * 50)
    return f"{ctx.http_base}/index.html"


def http_refused(ctx: Context) -> str:
    return f"http://127.0.0.1:{ctx.dead_port}/cam.mjpg"


# -- fatal builders --------------------------------------------------------------------------------------------------

Args = Callable[[Context], list[str]]


def _good_yaml(ctx: Context, extra: str = "") -> str:
    return f"sources:\n  - id: good\n    url: {good_clip(ctx)}\n{extra}"


def run_args(*args: str) -> Args:
    """The good clip plus these options."""
    return lambda ctx: ["--source", f"good={good_clip(ctx)}", *args]


def config_file(name: str, text: Callable[[Context], str] | str) -> Args:
    """A config file with this text (a function of the context, or fixed)."""
    def build(ctx: Context) -> list[str]:
        path = ctx.root / name
        path.write_text(text(ctx) if callable(text) else text)
        return [str(path)]
    return build


def config_bytes(name: str, data: bytes) -> Args:
    return lambda ctx: [_write(ctx.root / name, data)]


def with_model(make: Callable[[Context], str]) -> Args:
    return lambda ctx: run_args("--model", make(ctx))(ctx)


def onnx_model(name: str, input_shape: list[int], output_shape: list[int]) -> Callable[[Context], str]:
    """A tiny valid ONNX graph (one Constant node) with the given input and output shapes."""
    def build(ctx: Context) -> str:
        import numpy as np
        import onnx
        from onnx import TensorProto, helper

        value = onnx.numpy_helper.from_array(np.zeros(output_shape, np.float32), "value")
        graph = helper.make_graph([helper.make_node("Constant", [], ["output"], value=value)], "bad",
                                  [helper.make_tensor_value_info("images", TensorProto.FLOAT, input_shape)],
                                  [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_shape)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        path = ctx.root / name
        onnx.save(model, str(path))
        return str(path)
    return build


def text_model(ctx: Context) -> str:
    return _write(ctx.root / "notes.onnx", b"not a model\n")


def truncated_model(ctx: Context) -> str:
    assert ctx.model is not None, "needs the default model"
    data = ctx.model.read_bytes()
    return _write(ctx.root / "half.onnx", data[: len(data) // 2])


def directory_model(ctx: Context) -> str:
    path = ctx.root / "a_directory.onnx"
    path.mkdir(exist_ok=True)
    return str(path)


def deep_yaml(ctx: Context) -> str:
    return "sources: " + "[" * 5000 + "]" * 5000 + "\n"


def self_alias_yaml(ctx: Context) -> str:
    return f"sources: &loop\n  - url: {good_clip(ctx)}\n  - *loop\n"


FILE_CASES: list[SourceCase] = [
    SourceCase("missing", missing, "failed", r"no_such_clip\.mp4: no such file", what="a path that does not exist"),
    SourceCase("directory", directory, "failed", r"a_directory\.mp4: is a directory", what="a directory"),
    SourceCase("empty", empty, "failed", r"empty\.mp4: empty file", what="an empty file"),
    SourceCase("random", random_bytes, "failed", r"random\.mp4: not a video",
               what="200 kB of random bytes named .mp4"),
    SourceCase("text_avi", text_avi, "failed", r"notes\.avi: not a video", what="a text file named .avi"),
    SourceCase("html_mp4", html_mp4, "failed", r"page\.mp4: not a video", what="an HTML page saved as .mp4"),
    SourceCase("fifo", fifo, "failed", r"pipe\.mp4: empty file", what="a named pipe nobody writes to"),
    SourceCase("file_url", file_url_missing, "failed", r"gone\.mp4: no such file",
               what="a file:// URL to a missing file"),
    SourceCase("moov_missing", moov_missing, "failed", r"moov_missing\.mp4: not a video",
               what="MP4 with its index (moov) at the end, cut in half"),
    SourceCase("truncated", truncated_mid_stream, "failed",
               r"truncated\.mp4: truncated or corrupt, decoded \d+ of 30 frames", (1, 29),
               what="MP4 (index first) cut at 40 %: the decodable frames, then failed"),
    SourceCase("corrupt_nal", corrupt_nal_units, "ended", r"corrupt_nal\.ts: end of file", (25, 30),
               what="MPEG-TS with the slice data of 4 frames overwritten: decoding resumes at the next keyframe"),
    SourceCase("zeroed_mdat", zeroed_mdat, "failed", r"zeroed_mdat\.mp4: truncated or corrupt, decoded 0 of 30",
               what="MP4 whose frame data is all zero bytes"),
    SourceCase("audio_only", audio_only, "failed", r"audio\.m4a: no video stream", what="an AAC audio file"),
    SourceCase("subtitles_only", subtitles_only, "failed", r"subs\.mkv: no video stream",
               what="an MKV holding only subtitles"),
    SourceCase("png", png_still, "ended", r"still\.png: end of file", (1, 1),
               what="a PNG image: a one-frame video"),
    SourceCase("jpeg", jpeg_still, "ended", r"still\.jpg: end of file", (1, 1),
               what="a JPEG image: a one-frame video"),
    SourceCase("gif", gif, "ended", r"anim\.gif: end of file", (4, 4), what="an animated GIF of 4 frames"),
    SourceCase("raw_h264", raw_h264, "ended", r"raw\.h264: end of file", (8, 8),
               what="a raw H.264 elementary stream, no container and no timestamps"),
    SourceCase("ts_jumps", timestamp_jumps, "ended", r"ts_jumps\.ts: end of file", (15, 15),
               what="MPEG-TS whose timestamps jump 10 h ahead, then back to the start"),
    SourceCase("zero_fps", zero_fps, "ended", r"zero_fps\.mkv: end of file", (1, 5),
               what="every frame at timestamp 0 (no frame rate)"),
    SourceCase("huge_8k", huge_8k, "ended", r"huge_8k\.mp4: end of file", (2, 2), what="two 7680x4320 frames"),
    SourceCase("one_pixel", one_pixel, "ended", r"one_pixel\.mkv: end of file", (3, 3), what="a 1x1 video"),
    SourceCase("thin_strip", thin_strip, "ended", r"thin_strip\.mkv: end of file", (3, 3),
               what="a 2x1000 video (under one input pixel wide once scaled)"),
    SourceCase("gray16", gray16, "ended", r"gray16\.mkv: end of file", (3, 3), what="16-bit grey FFV1"),
    SourceCase("hevc_10bit", hevc_10bit, "ended", r"hevc10\.mp4: end of file", (3, 3), what="10-bit HEVC"),
    SourceCase("unknown_fourcc", unknown_fourcc, "failed", r"unknown_fourcc\.avi: .*(unsupported|codec|decoder)",
               what="an AVI whose codec tag (ZZZZ) no decoder knows"),
    SourceCase("unicode_name", unicode_name, "ended", r"entrée #1 \(copy\)\.mp4: end of file", (3, 3),
               what="a good clip whose name has accents, spaces, quotes and #"),
]

NET_CASES: list[SourceCase] = [
    SourceCase("rtsp_wrong_path", rtsp_wrong_path, "reconnecting", r"not_found", what="RTSP: no such mount (404)"),
    SourceCase("rtsp_wrong_password", rtsp_wrong_password, "reconnecting", r"auth",
               what="RTSP: wrong password (401)"),
    SourceCase("rtsp_no_credentials", rtsp_no_credentials, "reconnecting", r"auth",
               what="RTSP: credentials required, none given"),
    SourceCase("rtsp_refused", rtsp_refused, "reconnecting", r"refused", what="RTSP: nothing listening"),
    SourceCase("rtsp_dns", lambda ctx: "rtsp://no-such-camera.invalid:554/cam", "reconnecting", r"dns",
               what="RTSP: a host name that does not resolve"),
    SourceCase("rtsp_garbage", rtsp_garbage, "reconnecting", r"corrupt|invalid data",
               what="RTSP: a server that answers bytes that are not RTSP"),
    SourceCase("http_404", http_404, "reconnecting", r"not_found", what="HTTP: 404"),
    SourceCase("http_not_video", http_not_video, "reconnecting", r"corrupt|invalid data",
               what="HTTP: an HTML page instead of a video"),
    SourceCase("http_refused", http_refused, "reconnecting", r"refused", what="HTTP: nothing listening"),
]

FATAL_CASES: list[FatalCase] = [
    FatalCase("rtp_scheme", lambda ctx: ["--source", "rtp://127.0.0.1:5004"], r"unsupported scheme 'rtp'",
              "an unsupported URL scheme (rtp://)"),
    FatalCase("rtsp_no_host", lambda ctx: ["--source", "rtsp://"], r"malformed URL 'rtsp://': no host",
              "a malformed RTSP URL (rtsp://)"),
    FatalCase("rtsp_no_host_password", lambda ctx: ["--source", "rtsp://admin:S3cretPw@/x"],
              r"malformed URL 'rtsp://admin:\*\*\*@/x': no host",
              "a malformed RTSP URL with a password (masked in the error)", absent="S3cretPw"),
    FatalCase("dev_not_video", lambda ctx: ["--source", "/dev/sda"], r"unsupported device '/dev/sda'",
              "a device that is not /dev/videoN"),
    FatalCase("empty_source", lambda ctx: ["--source", ""], r"sources\[0\]\.url", "an empty --source"),
    FatalCase("max_batch_0", run_args("--max-batch", "0"), r"engine\.max_batch: .*greater than or equal to 1",
              "--max-batch 0"),
    FatalCase("max_batch_huge", run_args("--max-batch", "100000"),
              r"engine\.max_batch: .*less than or equal to 256", "--max-batch 100000"),
    FatalCase("negative_duration", run_args("--duration", "-5"), r"duration_s: .*greater than 0", "--duration -5"),
    FatalCase("metrics_port_range", run_args("--metrics-port", "70000"), r"metrics\.port: .*65535",
              "--metrics-port 70000"),
    FatalCase("bad_shard", run_args("--shard", "3/2"), r"--shard: expected I/N", "--shard 3/2"),
    FatalCase("endpoint_scheme", run_args("--publish", "udp://127.0.0.1:5555"), r"unsupported endpoint 'udp://",
              "a publish endpoint that is not tcp/ipc/inproc"),
    FatalCase("endpoint_bad_host", run_args("--publish", "tcp://256.1.1.1:5555"),
              r"cannot bind publish endpoint tcp://256\.1\.1\.1:5555", "a publish endpoint that cannot be bound"),
    FatalCase("endpoint_in_use", lambda ctx: run_args("--publish", f"tcp://127.0.0.1:{ctx.busy_port}")(ctx),
              r"cannot bind publish endpoint tcp://127\.0\.0\.1:\d+: Address already in use",
              "a publish endpoint another process has bound"),
    FatalCase("unknown_key", config_file("unknown.yaml", lambda ctx: _good_yaml(ctx, "engine:\n  turbo: true\n")),
              r"engine\.turbo: Extra inputs are not permitted", "a config with an unknown key"),
    FatalCase("wrong_type", config_file("type.yaml", lambda ctx: _good_yaml(ctx, "engine:\n  max_batch: many\n")),
              r"engine\.max_batch: .*integer", "a config value of the wrong type"),
    FatalCase("duplicate_ids", config_file("dup.yaml", lambda ctx: _good_yaml(ctx, f"  - id: good\n    url: "
                                                                                  f"{good_clip(ctx)}\n")),
              r"sources\[1\]\.id: duplicate id 'good'", "two sources with one id"),
    FatalCase("unset_env", config_file("env.yaml", "sources:\n  - id: cam\n"
                                                   "    url: rtsp://admin:${DETSTREAM_TEST_UNSET_PW}@10.0.0.5/s\n"),
              r"sources\[0\]\.url: environment variable \$\{DETSTREAM_TEST_UNSET_PW\} is not set",
              "an unset ${VAR}"),
    FatalCase("bad_id", config_file("id.yaml", lambda ctx: f"sources:\n  - id: 'front door'\n    url: "
                                                           f"{good_clip(ctx)}\n"),
              r"sources\[0\]\.id: String should match pattern", "a source id with a space"),
    FatalCase("no_sources", config_file("nosrc.yaml", "sources: []\n"), r"sources: List should have at least 1",
              "a config with no sources"),
    FatalCase("not_a_mapping", config_file("list.yaml", "- just\n- a list\n"),
              r"expected a mapping at the top level", "a YAML list instead of a mapping"),
    FatalCase("bad_yaml", config_file("broken.yaml", "sources: [\n  {id: x\n"), r"broken\.yaml: not valid YAML",
              "YAML that does not parse"),
    FatalCase("missing_config", lambda ctx: [str(ctx.root / "nowhere.yaml")], r"nowhere\.yaml: cannot read config",
              "a config file that does not exist"),
    FatalCase("binary_config", config_bytes("binary.yaml", bytes(range(128, 256)) * 8),
              r"binary\.yaml: not a text \(UTF-8\) file", "a config file that is not text (not UTF-8)"),
    FatalCase("deep_yaml", config_file("deep.yaml", deep_yaml), r"deep\.yaml: YAML nested too deeply",
              "YAML nested 5000 levels deep"),
    FatalCase("self_alias", config_file("alias.yaml", self_alias_yaml),
              r"sources\[1\]\[1\].*: nested more than \d+ levels deep \(a self-referencing YAML alias\?\)",
              "a YAML alias that contains itself"),
    FatalCase("unknown_class", config_file("cls.yaml", lambda ctx: _good_yaml(ctx, "model:\n  classes: [unicorn]\n")),
              r"model\.classes: unknown label.*unicorn", "a class filter naming a label the model lacks"),
    FatalCase("model_not_onnx", with_model(text_model), r"notes\.onnx: not an ONNX model",
              "a text file named .onnx"),
    FatalCase("model_truncated", with_model(truncated_model), r"half\.onnx: not an ONNX model",
              "the default model cut in half"),
    FatalCase("model_wrong_rank", with_model(onnx_model("rank3.onnx", [1, 3, 416], [1, 100, 85])),
              r"rank3\.onnx: input 'images' has shape \[1, 3, 416\]; expected \[N, 3, H, W\]",
              "an ONNX model whose input has rank 3"),
    FatalCase("model_no_layout", with_model(onnx_model("layout.onnx", [1, 3, 416, 416], [1, 10])),
              r"layout\.onnx: output shape \[1, 10\] matches no known layout",
              "an ONNX model whose output matches no known layout"),
    FatalCase("model_is_dir", with_model(directory_model), r"a_directory\.onnx: is a directory",
              "an .onnx path that is a directory"),
    FatalCase("model_missing", with_model(lambda ctx: str(ctx.root / "nowhere.onnx")),
              r"nowhere\.onnx: no such model file", "an .onnx path that does not exist"),
    FatalCase("model_unknown_name", run_args("--model", "yolov99-huge"),
              r"unknown model 'yolov99-huge'; known: yolov3-tiny", "an unknown model name"),
    FatalCase("annotate_is_file", lambda ctx: run_args("--annotate", _write(ctx.root / "afile", b"x"))(ctx),
              r"annotate\.dir .*afile: exists and is not a directory", "--annotate pointing at a regular file"),
]


def markdown_table(cases: list[SourceCase] | list[FatalCase], kind: str) -> str:
    """The rows of docs/reliability.md for one table."""
    lines = []
    for case in cases:
        if isinstance(case, FatalCase):
            lines.append(f"| `{case.id}` | {case.what} | exit 2, `detstream: error:` matching `{case.error}` |")
        else:
            low, high = case.frames
            frames = f"{low}" if low == high else f"{low}..{high if high is not None else 'n'}"
            lines.append(f"| `{case.id}` | {case.what} | {case.state}: `{case.reason}` | {frames} |")
    return "\n".join(lines)
