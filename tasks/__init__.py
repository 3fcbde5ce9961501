"""Prefect tasks: each a thin decorator around a plain, typed function that tests can call directly."""
