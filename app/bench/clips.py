"""Clips for the bench: the named test clips, shortened copies, and simulated cameras.

Copies are made once with PyAV into a cache folder and reused (the name says
what they are made of). Remuxing copies packets without decoding them, so a
shortened clip decodes exactly like the original.

Simulated cameras (:func:`camera_clips`): a copy of the clip at the cameras'
frame rate, encoded once with the clip's own codec, then one remux per camera
in which

* the content starts at a different keyframe (cameras do not all see the
  same frame at the same moment),
* every frame after the first is shifted by ``i / K`` of a frame interval, and
* the packets repeat until the file holds ``max_frames`` frames (the run's
  length and some), so that no camera loops during a run.

``detstream run --realtime`` paces each file from its first frame, so camera
``i`` delivers its frames ``i / K`` of an interval after camera 0, as
independent cameras do (their clocks are not in step). The files must not
loop: a looping file's next pass starts one frame interval after its last
frame, which would move camera ``i`` by another ``i / K`` of an interval on
every pass until all cameras deliver in step.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from fractions import Fraction
from pathlib import Path

import av

logger = logging.getLogger(__name__)

NAMED_CLIPS = {"vtest": "vtest.avi", "bikes": "bikes.mp4"}
CAMERA_TIME_BASE = Fraction(1, 1000)
CACHE_LIMIT_BYTES = 2 * 2**30
"""Copies are remade on demand, so the folder is pruned to this size, least recently used first (a
10-minute live run alone makes eight camera files of ~80 MB)."""
PARTIAL_MAX_AGE_S = 3600.0
"""A ``.part.mkv`` this old is what an interrupted run left; a younger one may be another run's, being written."""


def resolve_clip(name: str) -> Path:
    """``vtest`` / ``bikes`` (fetched into the cache by :func:`app.assets.fetch_clip`) or a path."""
    file_name = NAMED_CLIPS.get(name, name if name in NAMED_CLIPS.values() else None)
    if file_name is not None:
        from app.assets import fetch_clip

        return Path(fetch_clip(file_name, None)).resolve()
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"--clip {name}: no such file (use vtest, bikes or a path)")
    return path


def clip_label(name: str) -> str:
    """A short name for tables and JSON keys: ``vtest``, ``bikes`` or the file stem."""
    for label, file_name in NAMED_CLIPS.items():
        if name in (label, file_name):
            return label
    return Path(name).stem


def cache_name(clip: Path, what: str, suffix: str = ".mkv") -> str:
    """A cache file name for something made from ``clip``: a new one when the clip's path, size or mtime change."""
    st = clip.stat()
    digest = hashlib.sha256(f"{clip}:{st.st_size}:{st.st_mtime_ns}:{what}".encode()).hexdigest()[:12]
    return f"{clip.stem}-{what}-{digest}{suffix}"


def head_copy(clip: Path, frames: int, cache_dir: Path) -> Path:
    """The first ``frames`` video packets of ``clip``, remuxed (no re-encoding) into an MKV."""
    out_path = cache_dir / cache_name(clip, f"head{frames}")
    if _cached_copy(out_path, functools.partial(_remux_head, clip, frames)):
        prune_cache(cache_dir, [out_path])
    return out_path


def _cached_copy(out_path: Path, write: Callable[[Path], None]) -> bool:
    """Make ``out_path`` with ``write(part)`` unless the cache has it (then it is marked used); True when made.

    ``write`` fills a ``.part.mkv`` beside it that is renamed once complete, so an interrupted run never
    leaves a file that looks finished (:func:`prune_cache` removes old partials).
    """
    if out_path.exists():
        _mark_used(out_path)
        return False
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_suffix(".part.mkv")
    write(partial)
    partial.rename(out_path)
    return True


def _remux_head(clip: Path, frames: int, partial: Path) -> None:
    """The first ``frames`` video packets of ``clip`` into ``partial``, as they are."""
    with av.open(str(clip)) as src, av.open(str(partial), "w") as dst:
        in_stream = src.streams.video[0]
        out_stream = dst.add_stream_from_template(in_stream)
        copied = 0
        for packet in src.demux(in_stream):
            if packet.dts is None:
                continue
            packet.stream = out_stream
            dst.mux(packet)
            copied += 1
            if copied >= frames:
                break


def _encode_at_fps(clip: Path, fps: int, max_frames: int | None, cache_dir: Path) -> Path:
    """``clip`` re-encoded at ``fps`` (frames picked on a pts grid), keyframe every 2 s, no B-frames, same codec
    if possible."""
    out_path = cache_dir / cache_name(clip, f"{fps}fps{max_frames or ''}-nobf")
    _cached_copy(out_path, functools.partial(_reencode, clip, fps, max_frames))
    return out_path


def _reencode(clip: Path, fps: int, max_frames: int | None, partial: Path) -> None:
    """``clip`` into ``partial`` at ``fps``, at most ``max_frames`` frames (see :func:`_encode_at_fps`)."""
    with av.open(str(clip)) as src:
        in_stream = src.streams.video[0]
        codec = in_stream.codec_context.name
        codec = codec if codec in av.codecs_available and _can_encode(codec) else "mpeg4"
        with av.open(str(partial), "w") as dst:
            out = dst.add_stream(codec, rate=fps)
            out.width, out.height = in_stream.codec_context.width, in_stream.codec_context.height
            out.pix_fmt = "yuv420p"
            out.codec_context.max_b_frames = 0  # decode order = display order: the camera remux relies on it
            out.bit_rate = 2_000_000
            out.gop_size = 2 * fps
            written, next_t = 0, None
            for frame in src.decode(in_stream):
                t = float(frame.time or 0.0)
                if next_t is not None and t + 1e-6 < next_t:
                    continue
                next_t = (next_t if next_t is not None else t) + 1.0 / fps
                picture = av.VideoFrame.from_ndarray(frame.to_ndarray(format="yuv420p"), format="yuv420p")
                picture.pts = written
                picture.time_base = Fraction(1, fps)
                dst.mux(out.encode(picture))
                written += 1
                if max_frames is not None and written >= max_frames:
                    break
            dst.mux(out.encode(None))


def _can_encode(codec: str) -> bool:
    try:
        av.codec.Codec(codec, "w")
    except Exception:  # no encoder of that name in this FFmpeg build: the caller picks another codec
        return False
    return True


def camera_clips(clip: Path, cameras: int, fps: int, cache_dir: Path, max_frames: int | None = None) -> list[Path]:
    """One file per simulated camera: ``fps`` frames per second, phases spread over one interval (module doc)."""
    base = _encode_at_fps(clip, fps, max_frames, cache_dir)
    with av.open(str(base)) as src:
        packets = [p for p in src.demux(src.streams.video[0]) if p.dts is not None]
        keyframes = [i for i, p in enumerate(packets) if p.is_keyframe]
    total = max(max_frames or 0, len(packets))
    paths = []
    for camera in range(cameras):
        out_path = cache_dir / cache_name(base, f"cam{camera}of{cameras}-{total}f")
        start = keyframes[(camera * len(keyframes)) // cameras]
        _cached_copy(out_path, functools.partial(_remux_camera, base, start, camera / cameras / fps, fps, total))
        paths.append(out_path)
    prune_cache(cache_dir, [base, *paths])
    return paths


def prune_cache(cache_dir: Path, keep: Iterable[Path], limit_bytes: int = CACHE_LIMIT_BYTES) -> int:
    """Delete the least recently used copies until the folder holds at most ``limit_bytes``; never ``keep``,
    nor a ``.part.mkv`` younger than :data:`PARTIAL_MAX_AGE_S`. Returns how many files went."""
    kept = {path.resolve() for path in keep}
    now = time.time()
    entries = []
    for path in cache_dir.glob("*.mkv"):
        try:
            st = path.stat()
        except OSError:  # removed meanwhile
            continue
        entries.append((st.st_atime, st.st_size, st.st_mtime, path))
    total = sum(size for _, size, _, _ in entries)
    removed, freed = 0, 0
    for _, size, mtime, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit_bytes:
            break
        partial = path.name.endswith(".part.mkv")
        if path.resolve() in kept or (partial and now - mtime < PARTIAL_MAX_AGE_S):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        total, removed, freed = total - size, removed + 1, freed + size
    if removed:
        logger.info("bench: removed %d least recently used clip copies (%.0f MB) from %s to keep it under %.0f MB",
                    removed, freed / 2**20, cache_dir, limit_bytes / 2**20)
    return removed


def _mark_used(path: Path) -> None:
    """Set the access time only: a copy's modification time is part of the names of the copies made from it."""
    with contextlib.suppress(OSError):  # gone meanwhile: it is remade when needed
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))  # ns: the names hash st_mtime_ns


def _remux_camera(base: Path, start: int, phase_s: float, fps: int, total: int, partial: Path) -> None:
    """``total`` packets of ``base`` from packet ``start`` (a keyframe) on, round and round (packet 0 is a
    keyframe too, and the copy has no B-frames), every one after the first ``phase_s`` late on the fps grid."""
    with av.open(str(base)) as src, av.open(str(partial), "w") as dst:
        in_stream = src.streams.video[0]
        packets = [(bytes(p), p.is_keyframe) for p in src.demux(in_stream) if p.dts is not None]
        order = packets[start:] + packets[:start]
        out_stream = dst.add_stream_from_template(in_stream)
        for index in range(total):
            data, keyframe = order[index % len(order)]
            packet = av.Packet(data)  # a muxed packet is consumed: a new one per copy
            packet.is_keyframe = keyframe
            t = index / fps + (phase_s if index else 0.0)
            packet.stream = out_stream
            packet.time_base = CAMERA_TIME_BASE
            packet.pts = packet.dts = round(t / CAMERA_TIME_BASE)
            packet.duration = round(1 / fps / CAMERA_TIME_BASE)
            dst.mux(packet)
