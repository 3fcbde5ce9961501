"""Prefect deployments: schedules, triggers and work pools are declared here and nowhere else."""
