"""Prefect deployments: schedules, triggers and work pools are declared here and nowhere else, and the
Kubernetes resources that run them.

- `definitions`: the deployments, their schedule and trigger, the news automation, `python -m podium.deployments`
- `k8s`: the Kubernetes manifests of a config: a KubeRay RayJob, `podium serve`, the Prefect worker and work pool
- `k8s_watch`: a RayJob followed through the Kubernetes API to its end, in podium's terms
- `k8s_node`: `podium k8s ray-head`, the RayJob head's first process: a pod's SIGTERM stops the night's jobs (their
  drivers get SIGTERM) before Ray
"""
