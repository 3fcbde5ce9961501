"""Validation functions named by import path in the unit tests."""


def needs_run_and_epoch(checkpoint, train_run_name, epoch):
    return {}


def no_checkpoint():
    return {}


def metrics_only(checkpoint, val_data):
    """A validation function that cannot be asked for per-row values (no per_row argument)."""
    return {"val_loss": 0.0}


def metrics_with_rows(checkpoint, val_data, per_row=False):
    """One that can."""
    return {"val_loss": 0.0}
