"""podium's version, recorded on every run's lineage."""

__version__ = "0.1.0"
