"""The code that runs inside Ray workers: data, model, loop, checkpoint format, events.

Nothing here imports prefect or mlflow; it is importable and testable with no
orchestrator or tracking server around.
"""
