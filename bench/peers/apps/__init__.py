"""The peers' own side of the workload, each run by its peer's interpreter (its own
virtualenv): not imported by the benchmark, so not type-checked with it."""
