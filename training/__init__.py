"""torch and Ray Train: the code that runs inside Ray workers, and what loads what they made.

Data, preprocessing, the model, the built-in loop and validation, the checkpoint format, the export
for serving, the cluster, and the one module that uses Ray Train's alpha V2 APIs (`raytrain`);
`promoted` loads a promoted model, `resources` says what a run asks of Ray. Nothing here imports
prefect or mlflow at import time; it is importable and testable with no orchestrator or tracking
server around.
"""
