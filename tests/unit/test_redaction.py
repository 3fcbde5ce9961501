"""Credentials never reach MLflow params."""

from podium.tracking.runs import flatten_params


def test_secret_keys_and_uri_credentials_are_redacted():
    params = flatten_params({
        "storage": "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix",
        "validation": {"kwargs": {"db_password": "hunter2", "api_key": "abc", "aws_secret_access_key": "xyz",
                                  "url": "postgresql://podium:s3cr3t@db:5432/x", "batch": 4}},
    })
    text = repr(params)
    for secret in ("AKIAEXAMPLE", "wJalrXUtnFEMI", "hunter2", "abc", "xyz", "s3cr3t"):
        assert secret not in text
    assert params["storage"] == "s3://***@bucket/prefix"
    assert params["validation.kwargs.url"] == "postgresql://***@db:5432/x"
    assert params["validation.kwargs.batch"] == "4"


def test_credentials_in_location_uris_are_refused_without_echoing_them():
    import pytest

    from podium.config import build_config
    from podium.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_config({"storage": "s3://AKIAEXAMPLE:topsecret@bucket/x", "data": {"val": "s3://a:b@c/v"}})
    text = str(err.value)
    assert "storage" in text and "data.val" in text and "credentials in a URI" in text
    assert "topsecret" not in text
