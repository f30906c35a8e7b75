#!/usr/bin/python3
"""A small RTSP server for tests and demos (GStreamer GstRtspServer; run with the system python).

    /usr/bin/python3 scripts/rtsp_server.py --port 8554 \\
        --mount /clip=tests/data/clip.mp4 --mount /live=pattern:768x576@5 --user u --password p --loop

Mounts:
  /path=FILE.mp4        the file's H.264 stream, sent as is (no re-encoding), paced at its frame rate;
                        with --loop it restarts at the end (each client gets its own pipeline)
  /path=pattern[:WxH@FPS]  an endless live test pattern encoded with x264 (default 320x240@10);
                        shared by the clients of that mount
Binds 127.0.0.1 only; port 0 picks a free one. Prints ``READY port=N`` once listening,
exits 0 on SIGTERM/SIGINT. Needs python3-gi, gir1.2-gst-rtsp-server-1.0 and the good/ugly plugins.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

PATTERN = re.compile(r"^pattern(?::(\d+)x(\d+)@(\d+(?:\.\d+)?))?$")


def pipeline_for(source: str) -> tuple[str, bool]:
    """The launch line for a mount, and whether clients share it."""
    match = PATTERN.match(source)
    if match:
        width, height, fps = match.group(1) or "320", match.group(2) or "240", match.group(3) or "10"
        num, den = (int(float(fps) * 1000), 1000) if "." in fps else (int(fps), 1)
        return (f"( videotestsrc is-live=true pattern=ball ! video/x-raw,width={width},height={height},"
                f"framerate={num}/{den} ! timeoverlay ! x264enc tune=zerolatency speed-preset=ultrafast "
                f"key-int-max=10 bframes=0 ! video/x-h264,profile=baseline ! rtph264pay name=pay0 pt=96 "
                f"config-interval=1 )", True)
    location = GLib.strescape(source)
    return (f'( filesrc location="{location}" ! qtdemux name=demux demux.video_0 ! queue ! h264parse ! '
            f"rtph264pay name=pay0 pt=96 config-interval=1 )", False)


def loop_at_eos(_factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
    """Restart a file from the beginning when its demuxer reaches the end (--loop)."""
    pipeline = media.get_element()
    parse = next((e for e in _iterate(pipeline) if e.get_factory() and e.get_factory().get_name() == "h264parse"), None)
    if parse is None:
        return

    def on_event(_pad: Gst.Pad, info: Gst.PadProbeInfo) -> Gst.PadProbeReturn:
        event = info.get_event()
        if event.type == Gst.EventType.EOS:
            GLib.idle_add(_rewind, media)
            return Gst.PadProbeReturn.DROP
        if event.type == Gst.EventType.SEGMENT_DONE:
            return Gst.PadProbeReturn.DROP
        return Gst.PadProbeReturn.OK

    parse.get_static_pad("sink").add_probe(Gst.PadProbeType.EVENT_DOWNSTREAM, on_event)


def _rewind(media: GstRtspServer.RTSPMedia) -> bool:
    media.get_element().seek_simple(Gst.Format.TIME, Gst.SeekFlags.FLUSH | Gst.SeekFlags.KEY_UNIT, 0)
    return False


def _iterate(bin_: Gst.Bin) -> list[Gst.Element]:
    found: list[Gst.Element] = []
    iterator = bin_.iterate_recurse()
    while True:
        result, element = iterator.next()
        if result != Gst.IteratorResult.OK:
            return found
        found.append(element)


def build_server(args: argparse.Namespace) -> GstRtspServer.RTSPServer:
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string(GstRtspServer.RTSP_TOKEN_MEDIA_FACTORY_ROLE, "user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password or ""), token)
        server.set_auth(auth)
    mounts = server.get_mount_points()
    for spec in args.mount:
        path, _, source = spec.partition("=")
        if not path.startswith("/") or not source:
            raise SystemExit(f"--mount {spec!r}: expected /path=FILE.mp4 or /path=pattern[:WxH@FPS]")
        launch, shared = pipeline_for(source)
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(launch)
        factory.set_shared(shared)
        if args.user:
            factory.add_role_from_structure(Gst.Structure.new_from_string(
                "user, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"))
        if args.loop and not shared:
            factory.connect("media-configure", loop_at_eos)
        mounts.add_factory(path, factory)
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8554)
    parser.add_argument("--mount", action="append", default=[], help="/path=FILE.mp4 or /path=pattern[:WxH@FPS]")
    parser.add_argument("--user")
    parser.add_argument("--password")
    parser.add_argument("--loop", action="store_true", help="restart file mounts at their end")
    args = parser.parse_args(argv)
    if not args.mount:
        parser.error("at least one --mount is needed")
    Gst.init(None)
    server = build_server(args)
    loop = GLib.MainLoop()
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, lambda: (loop.quit(), False)[1])
    print(f"READY port={server.get_bound_port()}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
