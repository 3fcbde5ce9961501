"""One way to keep credentials out of messages, logs, parameters and records."""

from __future__ import annotations

import re

# user:password@ (or token@) right after a URI scheme, anywhere in a text
URI_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s'\"]+@", re.I)
# keys whose values are secrets whatever they look like
SECRET_KEY = re.compile(r"(secret|passw|token|credential|api[_-]?key|access[_-]?key|private[_-]?key)", re.I)
# a URI that carries a password (user:password@): refused as a location
URI_WITH_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@]*:[^/@]*@", re.I)
HIDDEN = "***"


def redact_uri(text: str) -> str:
    """`text` with the user:password@ part of every URI in it replaced by ***@."""
    return URI_USERINFO.sub(rf"\g<scheme>{HIDDEN}@", text)


def redact_value(key: str, value: str) -> str:
    """A value to show under `key`: *** for secret-looking keys, else with URI credentials hidden."""
    if SECRET_KEY.search(key):
        return HIDDEN
    return redact_uri(value)


def has_password(uri: str) -> bool:
    """True for a URI with an embedded password (s3://KEY:SECRET@bucket)."""
    return bool(URI_WITH_PASSWORD.match(uri or ""))
