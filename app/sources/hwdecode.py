"""Hardware decoding (``decode: cuda``) through PyAV's ``HWAccel``, with an explicit fallback.

``allow_software_fallback=False`` makes a failure visible instead of silently
decoding on the CPU inside FFmpeg; the source then falls back itself and says
so once at WARNING (PyAV ``examples/basics/hw_decode.py`` does the same).
Decoded frames are copied back to host memory by PyAV (``is_hw_owned=False``)
because letterboxing runs on the CPU.
"""

from __future__ import annotations


def hwaccel_for(device_type: str) -> tuple[object | None, str]:
    """``(HWAccel, "")`` when this PyAV/FFmpeg lists ``device_type``, else ``(None, why not)``."""
    try:
        from av.codec.hwaccel import HWAccel, hwdevices_available
    except ImportError:
        return None, "this PyAV has no hardware decoding support"
    available = list(hwdevices_available())
    if device_type not in available:
        return None, f"FFmpeg lists no {device_type} device (available: {', '.join(available) or 'none'})"
    try:
        return HWAccel(device_type=device_type, allow_software_fallback=False), ""
    except Exception as exc:  # any failure here means: decode on the CPU
        return None, f"{type(exc).__name__}: {exc}"
