"""Prefect deployments: schedules, triggers and work pools are declared here and nowhere else.

- `definitions`: the deployments, their schedule and trigger, the news automation, `python -m podium.deployments`
"""
