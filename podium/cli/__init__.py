"""The `podium` command: what a person or a scheduler starts. Nothing else in podium imports it.

- `main`: the parser and the entry point (`podium`, `python -m podium`, `python -m podium.cli`)
- `options`: the options of `run` and `promote`, and the configuration they set
- `errors`: the errors printed without a traceback, and their exit codes
- `run`: `podium run` and `podium promote`: the start-up beside the servers, the flow run, its exit codes
- `recorded`: `podium promote` of a run on the run's own recorded settings, under the command's
- `commands`: what the other commands do once their arguments are parsed
- `output`: what the commands print (a summary for people, or one JSON object)
- `serve`: `podium serve`: a serving location's champion over HTTP on Ray Serve, following its promotions
- `provenance`: `podium lineage`, and what `podium status` says about data and origins
- `k8s`: `podium k8s render` (Kubernetes manifests of podium's jobs) and `podium k8s watch` (a RayJob's end)
"""

from podium.cli.main import main

__all__ = ["main"]
