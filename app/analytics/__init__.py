"""Zones and lines: per-source regions that turn tracked boxes into counts and events (docs/analytics.md).

``config`` holds the validated fields of ``sources[].zones`` / ``lines``;
``geometry`` the vectorised point-in-polygon and side-of-line tests;
``regions`` the debounced per-track semantics of one zone or line;
``engine`` every stream's regions, run on the postprocess thread after
tracking; ``overlay`` the drawing on annotated frames.
"""
