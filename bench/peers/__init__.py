"""Threadline side by side with durable-execution peers (Restate, DBOS, the LangGraph
dev server) on one agent workload: `python -m bench.peers`, `make bench-peers`.
One module per system, `workload` (the side-effect log, pure), `driver` (the
measurements), `report` (the section of docs/benchmarks.md)."""
