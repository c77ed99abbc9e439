"""h5batch.remote.client against a real moto server on loopback (and a fault proxy)."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

from h5batch.errors import ObjectChangedError, RemoteError  # noqa: E402
from h5batch.remote.client import ObjectClient  # noqa: E402
from tests.support.s3server import CREDS, FaultProxy, server_fixture  # noqa: E402

s3 = pytest.fixture(scope="module")(server_fixture)


def _opts(endpoint: str, **kw) -> dict:
    return {"endpoint_url": endpoint, "key": CREDS["AWS_ACCESS_KEY_ID"],
            "secret": CREDS["AWS_SECRET_ACCESS_KEY"], **kw}


def test_upload_then_ranged_gets_return_the_bytes(s3, tmp_path):
    data = os.urandom((16 << 20) + 12345)  # more than one part: a multipart upload
    (tmp_path / "f").write_bytes(data)
    c = ObjectClient("s3://bench/t/f.h5", _opts(s3.endpoint))
    assert c.head() is None
    etag, size = c.upload(tmp_path / "f")
    assert size == len(data) and c.head() == (etag, size)
    assert c.get(5, 70_000, etag) == data[5:70_000]
    assert c.get(len(data) - 10, len(data)) == data[-10:]


def test_environment_gives_endpoint_and_credentials(s3, monkeypatch):
    s3.client().put_object(Bucket="bench", Key="t/env", Body=b"0123456789")
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert ObjectClient("s3://bench/t/env").get(2, 5) == b"234"


def test_the_aws_cli_files_give_credentials_region_and_endpoint(s3, tmp_path, monkeypatch):
    s3.client().put_object(Bucket="bench", Key="t/files", Body=b"0123456789")
    proxy = FaultProxy(s3.endpoint)
    try:
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                  "AWS_REGION", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(k, raising=False)
        (tmp_path / "credentials").write_text("[default]\naws_access_key_id = WRONG\naws_secret_access_key = x\n"
                                              "[train]\naws_access_key_id = FROMFILE\naws_secret_access_key = s3cr3t\n")
        (tmp_path / "config").write_text(f"[profile train]\nregion = eu-west-1\nendpoint_url = {proxy.endpoint}\n")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
        monkeypatch.setenv("AWS_PROFILE", "train")
        assert ObjectClient("s3://bench/t/files").get(2, 5) == b"234"
        counts = proxy.counts()
        assert counts.get("key FROMFILE") == 1 and "key WRONG" not in counts
        # The environment's keys come first, whole: the file's secret is not mixed in.
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "FROMENV")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "other")
        assert ObjectClient("s3://bench/t/files").get(0, 1) == b"0"
        assert proxy.counts().get("key FROMENV") == 1
    finally:
        proxy.close()


def test_replaced_object_is_an_error_naming_the_url(s3):
    s3.client().put_object(Bucket="bench", Key="t/r", Body=b"a" * 100)
    c = ObjectClient("s3://bench/t/r", _opts(s3.endpoint))
    etag, _ = c.head()
    s3.client().put_object(Bucket="bench", Key="t/r", Body=b"b" * 100)
    with pytest.raises(ObjectChangedError, match="s3://bench/t/r: the object was replaced"):
        c.get(0, 10, etag)


def test_500_on_every_request_fails_within_the_retry_budget(s3):
    proxy = FaultProxy(s3.endpoint, "500")
    try:
        c = ObjectClient("s3://bench/t/x", _opts(proxy.endpoint, retries=3))
        t = time.monotonic()
        with pytest.raises(RemoteError) as e:
            c.get(100, 200)
        assert time.monotonic() - t < 10
        assert proxy.counts()["GET"] == 3
        msg = str(e.value)
        assert msg.startswith("s3://bench/t/x: GET bytes 100-199 failed after 3 tries") and "500" in msg
        assert CREDS["AWS_SECRET_ACCESS_KEY"] not in msg and CREDS["AWS_ACCESS_KEY_ID"] not in msg
    finally:
        proxy.close()


def test_failed_upload_leaves_no_object_and_no_parts(s3, tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(40 << 20))
    proxy = FaultProxy(s3.endpoint, "500-put")
    try:
        c = ObjectClient("s3://bench/t/failed.h5", _opts(proxy.endpoint, retries=2))
        with pytest.raises(RemoteError, match="s3://bench/t/failed.h5: upload of 41943040 bytes failed"):
            c.upload(tmp_path / "f")
    finally:
        proxy.close()
    assert "t/failed.h5" not in s3.keys()
    assert s3.uploads() == []


def test_unknown_storage_option_is_named():
    with pytest.raises(TypeError, match="unknown storage_options \\['anon_'\\]"):
        ObjectClient("s3://bench/x", {"anon_": True})
