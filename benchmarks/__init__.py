"""podium's benchmarks: speed is measured here, never asserted in tests (see BENCHMARKS.md)."""
