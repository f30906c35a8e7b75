#!/usr/bin/env bash
# Installs the Debian packages detstream's set-up needs, only when missing.
#   system_deps.sh demo   apt package lists (the demo clip comes from `apt-get download opencv-doc`)
#   system_deps.sh test   + ffmpeg, GStreamer's RTSP server for the system python3 (integration tests)
#                         and chromium (the live page's browser test drives it with Playwright)
set -euo pipefail
what=${1:-test}
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else echo "system_deps: not root and no sudo; skipping apt" >&2; exit 0; fi
fi
need=()
if [ "$what" = test ]; then
  command -v ffmpeg >/dev/null || need+=(ffmpeg)
  command -v chromium >/dev/null || need+=(chromium)
  # Every element scripts/rtsp_server.py launches, not just the server library: timeoverlay comes with
  # gstreamer1.0-x on Debian (a mere recommends, which --no-install-recommends skips).
  /usr/bin/python3 - <<'PY' 2>/dev/null || need+=(python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base \
      gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav \
      gstreamer1.0-x gstreamer1.0-tools)
import sys
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer  # noqa: F401
Gst.init(None)
elements = ("videotestsrc", "timeoverlay", "x264enc", "rtph264pay", "filesrc", "qtdemux", "h264parse", "queue")
sys.exit(1 if [e for e in elements if Gst.ElementFactory.find(e) is None] else 0)
PY
fi
lists=$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' 2>/dev/null | head -1)
if [ -z "$lists" ] || [ ${#need[@]} -gt 0 ]; then
  echo "system_deps: apt-get update" >&2
  $SUDO apt-get update -q >/dev/null
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "system_deps: installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
