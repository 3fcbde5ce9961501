"""podium: train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best."""

__version__ = "0.1.0"


from typing import Any


def load_promoted_model(serving_uri: str) -> Any:
    """The current champion at a serving location as a torch module in eval mode (see podium.serving.load)."""
    from podium.serving.load import load_promoted_model as _load

    return _load(serving_uri)
