"""Prefect flows: they compose tasks in the order of the design card and hold no ML code."""
