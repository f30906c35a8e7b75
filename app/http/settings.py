"""The ``http:`` config section: the live page and the REST API (:mod:`app.http`).

Kept apart from :mod:`app.config` (which imports it) so that reading a config
never imports the web framework.
"""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TOKEN_ENV = "DETSTREAM_HTTP_TOKEN"


class HttpConfig(BaseModel):
    """The HTTP server: off unless ``enabled``; loopback by default.

    Bound to any other address, the control routes (``POST``, ``PATCH``,
    ``DELETE``, reload) require ``Authorization: Bearer <token>`` with the token
    read from the environment variable ``token_env``, and the server refuses to
    start without it. The view routes (the page, pictures, ``GET /api/...``)
    need the token too unless ``public_view`` is set.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    enabled: bool = Field(False, description="serve the live page and the API")
    host: str = Field("127.0.0.1", max_length=255, description="address to serve on; off loopback the token is "
                      "required")
    port: int = Field(8080, ge=0, le=65535, description="0: any free port (tests)")
    view_fps: float = Field(5.0, gt=0, le=30.0, description="pictures per second drawn per watched source, at most")
    jpeg_quality: int = Field(75, ge=10, le=100, description="JPEG quality of the pictures")
    token_env: str = Field(DEFAULT_TOKEN_ENV, min_length=1, max_length=128,
                           description="environment variable holding the bearer token for the control routes")
    public_view: bool = Field(False, description="off loopback, serve the page and GET routes without the token")
    max_body_bytes: int = Field(16384, ge=256, le=1 << 20, description="larger request bodies are refused (413)")
    allowed_paths: list[str] = Field(default_factory=list, description="directories whose files may be added as "
                                     "sources through the API; none by default")

    @property
    def loopback(self) -> bool:
        """Whether the server is reachable from this machine only."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


__all__ = ["DEFAULT_TOKEN_ENV", "HttpConfig"]
