"""podium: train on Ray Train, validate every checkpoint as it lands, record in MLflow, promote the best."""

__version__ = "0.1.0"


def load_promoted_model(serving_uri: str):
    """The current champion at a serving location as a torch module in eval mode (see training.serving)."""
    from podium.serving.load import load_promoted_model as _load

    return _load(serving_uri)
