"""Prefect flows, and the state a running flow keeps; no ML code, no torch.

- `pipeline`: the flow `train-validate-promote`
- `promote`: the flow `promote-run` (promotion alone, on a run that has trained)
- `validate_announced`: the flow `validate-checkpoint`, one run per checkpoint announced by a job of its own
- `stream`, `validation`, `stop`, `summary`: a running flow's state: the checkpoints as they are announced,
  their validations (at most `concurrency` at once), a clean stop on a signal, the run's end
"""
