"""Whether a server answered: one rule for every server podium calls (the Prefect API through httpx, the
MLflow tracking server through requests and MLflow's REST client).

A call that raised either reached a server that answered (a 4xx, a refusal: the answer stands) or did
not (a connection refused or cut, a timeout, a 5xx): only the second is an outage, worth waiting for.
"""

from __future__ import annotations

import re
import sys
from concurrent.futures import TimeoutError as FutureTimeout

# Transport failures leave MLflow's REST client as "API request to <url> failed with ...";
# answers the server did give (a missing run, a bad parameter) carry its error code instead.
_TRANSPORT_FAILURE = re.compile(r"^API request to \S+ failed with")


def _loaded(module: str, name: str) -> tuple[type[BaseException], ...]:
    """The exception class `module.name` if that library is loaded, else none: an exception of a library that
    was never imported cannot have been raised, and importing httpx, requests or MLflow here only to compare
    would load them into every process that asks (MLflow takes about a second)."""
    loaded = sys.modules.get(module)
    return (getattr(loaded, name),) if loaded is not None else ()


def is_unreachable(exc: BaseException) -> bool:
    """Whether an exception from a call to a server means the server did not answer (rather than answered with
    an error): a connection refused or cut, a timeout, a 5xx answer, MLflow's REST client giving up on its
    transport; else what it was raised from."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return status >= 500  # an answer: a server error is no answer, a refusal (4xx) is one
    transport: tuple[type[BaseException], ...] = (TimeoutError, FutureTimeout, ConnectionError,
                                                  *_loaded("httpx", "TransportError"),
                                                  *_loaded("requests", "RequestException"))
    if isinstance(exc, transport):
        return True
    if isinstance(exc, _loaded("mlflow.exceptions", "MlflowException")) and _TRANSPORT_FAILURE.match(
            str(getattr(exc, "message", exc))):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and is_unreachable(cause)
