"""torch and Ray Train: the code that runs inside Ray workers, what starts the Ray side of a run from the
driver, and what loads what the workers made.

Nothing here imports prefect or mlflow at import time (`promoted` loads MLflow's pyfunc when it is
called); it is importable and testable with no orchestrator or tracking server around.

In Ray workers (training and validation):

- `loop`: the built-in `train_loop_per_worker`
- `model`: the built-in model, a small MLP classifier
- `data`: Parquet data read with pyarrow: schema checks, batches for validation, synthetic data
- `preprocessing`, `stats`: the training data's feature statistics, in one streaming pass
- `checkpoint`: podium's checkpoint format
- `sharded`: sharded (DCP) checkpoints consolidated in one process
- `validate`: the built-in validation function
- `loaders`: a framework's checkpoint folder to the module podium serves

On the driver (the process that runs the flow):

- `cluster`: starting or joining the Ray cluster, warming up the validation workers
- `head`: watching the Ray cluster's head while a run depends on it
- `resources`: what a run asks of Ray, from its configuration alone
- `ingest`: the Parquet datasets handed to the TorchTrainer through Ray Data
- `raytrain`: the one module that uses Ray Train's alpha V2 APIs (the trainer, its callback, the persisted checkpoints)
- `validation_call`: a validation function called as a Ray task of its own

Where what was made is used:

- `export`: a checkpoint to what serving needs (a `torch.export` program and its spec)
- `promoted`: the champion as a model, checked against its manifest

The Ray Serve deployment `podium serve` runs is `podium.live`.
"""
