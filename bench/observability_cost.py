"""The cost of observability: processor throughput and token latency with metrics and
tracing off and on, side by side in one run.

Processor: the throughput case's payload (threads created, messages posted, started
and completed), each command carrying a W3C traceparent, one in 100 sampled (as a
gateway sampling 1% of new traces would send them); each case in a child process of
its own on fresh topics, interleaved, repeated, medians and round-by-round ratios:

* *off*: THREADLINE_METRICS=off, no tracing: the processor records nothing;
* *metrics*: every metric recorded, served on a port and scraped once a second;
* *metrics + tracing 1%*: and spans of the sampled commands exported over OTLP/HTTP
  to a sink in this process (which only answers 200);
* *metrics + tracing 100%*: every command sampled, for scale.

Token latency: `bench.token_latency` (a gateway, a stream generator, SSE clients and a
direct consumer) with the gateway's metrics off, then on with tracing at 1%.
"""

from __future__ import annotations

import argparse
import json
import secrets
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import VAR, Figure, bench_env, cleanup, load_text, median, run_child_json
from bench.processor_throughput import _child_threadline, payload, preload
from streams.config import Settings
from streams.core.domain import Command
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.wire import Codec, new_meta

BENCH = "observability"
OFF = "processor, observability off"
METRICS = "processor, metrics on"
TRACED = "processor, metrics + tracing 1%"
TRACED_ALL = "processor, metrics + tracing 100%"
SAMPLED_EVERY = 100
CODEC = Codec()


def traced_records(commands: list[Command], sampled_every: int) -> list[tuple[bytes, bytes]]:
    """The commands as records, each in a trace of its own, one in `sampled_every` sampled."""
    out = []
    for index, c in enumerate(commands):
        flags = "01" if index % sampled_every == 0 else "00"
        traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{flags}"
        out.append((c.thread_id.encode(),
                    CODEC.encode_command(c, new_meta(c.thread_id, "bench", 0, traceparent))))
    return out


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


def _scrape(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                response.read()
        except OSError:
            pass


def hook_cost(records: int = 200_000, batch: int = 500) -> dict[str, float]:
    """CPU µs a record of the processor's observability hooks, measured in this process:
    what metrics add per command (staged counts, flushed once a batch), and what tracing
    adds per unsampled record (finding the parent and reading its sampled flag)."""
    from streams.core.domain import MessageAccepted, RunAccepted
    from streams.observability import tracing
    from streams.observability.processor import ProcessorObserver

    observer = ProcessorObserver("bench.commands")
    command = payload(1, 1)[1]
    events = [MessageAccepted("t", "m", "x", None, 0), RunAccepted("t", "r", "w", "m", 0)]
    started = time.process_time()
    for index in range(records):
        observer.command(command, "decided")
        observer.events(events)
        if index % batch == batch - 1:
            observer.committed(batch)
    metrics_us = (time.process_time() - started) / records * 1e6
    headers = [("traceparent", f"00-{'1' * 32}-{'2' * 16}-00".encode())]
    started = time.process_time()
    for _ in range(records):
        tracing.sampled(tracing.record_traceparent(headers, None))
    return {"metrics µs/cmd": metrics_us,
            "tracing µs/unsampled cmd": (time.process_time() - started) / records * 1e6}


def child_main(argv: list[str] | None = None) -> None:
    """The timed child: one processor with the observability of its environment."""
    from streams.observability.metrics import processor_metrics
    from streams.observability.role import observe_role

    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    observe_role(settings, "processor", processor_metrics)
    ensure_topics(settings)
    Path(args.out).write_text(json.dumps(_child_threadline(settings, args.count)))


def run_case(bootstrap: str, case: str, records: list[tuple[bytes, bytes]], otlp: str,
             folder: Path) -> dict[str, Any]:
    """Preload the commands and time one case in a child process."""
    extra: dict[str, str] = {}
    port = free_port()
    if case == OFF:
        extra["THREADLINE_METRICS"] = "off"
    else:
        extra["THREADLINE_METRICS_PORT"] = str(port)
    if case in (TRACED, TRACED_ALL):
        extra.update(THREADLINE_OTLP_ENDPOINT=otlp, THREADLINE_TRACE_SAMPLE_RATIO="0.01")
    env = bench_env(bootstrap)
    env.update(extra)
    settings = Settings.from_env(env)
    ensure_topics(settings)
    preload(settings, records)
    load = load_text()
    stop = threading.Event()
    scraper = threading.Thread(target=_scrape, args=(f"http://127.0.0.1:{port}/metrics", stop),
                               daemon=True)
    if case != OFF:
        scraper.start()
    try:
        result = run_child_json("bench.observability_cost", ["child", "--count", str(len(records))],
                                env, folder / f"obs-{settings.topic_prefix}log", 300)
    finally:
        stop.set()
        cleanup(settings)
    result["load"] = load
    return result


def run(bootstrap: str, threads: int = 1000, messages: int = 3, repeats: int = 3,
        token_seconds: float = 15) -> list[Figure]:
    """Processor throughput and token latency, observability off and on, as figures."""
    from bench import token_latency

    commands = payload(threads, messages)
    records = {case: traced_records(commands, 1 if case == TRACED_ALL else SAMPLED_EVERY)
               for case in (OFF, METRICS, TRACED, TRACED_ALL)}
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    otlp = f"http://127.0.0.1:{sink.server_address[1]}"
    folder = VAR / "bench-logs"
    folder.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in records}
    try:
        for repeat in range(repeats):
            for case in records:
                result = run_case(bootstrap, case, records[case], otlp, folder)
                runs[case].append(result)
                print(f"  [{repeat + 1}/{repeats}] {case:36s} {result['per_s']:8.0f} cmd/s "
                      f"{result['cpu_us']:7.1f} CPU µs/cmd  (load {result['load']})", flush=True)
        figures = []
        for case, results in runs.items():
            base = None if case == OFF else OFF
            values = {"cmd/s": median([r["per_s"] for r in results]),
                      "CPU µs/cmd": median([r["cpu_us"] for r in results]), "runs": len(results)}
            if base is not None:  # round by round, then the median
                values["x off"] = median([r["per_s"] / b["per_s"]
                                          for r, b in zip(results, runs[OFF], strict=True)])
            figures.append(Figure(BENCH, case, values, base, {"processor": values["CPU µs/cmd"]},
                                  " / ".join(r["load"] for r in results),
                                  "cmd/s by round: " + " | ".join(f"{r['per_s']:.0f}" for r in results)))
        token_off = token_latency.run(bootstrap, seconds=token_seconds,
                                      extra={"THREADLINE_METRICS": "off"})[0]
        token_on = token_latency.run(bootstrap, seconds=token_seconds, extra={
            "THREADLINE_OTLP_ENDPOINT": otlp, "THREADLINE_TRACE_SAMPLE_RATIO": "0.01"})[0]
    finally:
        sink.shutdown()
    token_off.bench = token_on.bench = BENCH
    token_off.case, token_on.case = "token latency, observability off", "token latency, metrics + tracing 1%"
    token_off.baseline, token_on.baseline = None, token_off.case
    for metric in ("p50 ms", "p99 ms"):
        token_on.values[f"x off {metric}"] = token_on.values[metric] / token_off.values[metric]
    hooks = Figure(BENCH, "processor hooks, in process", hook_cost(), None, {}, load_text(),
                   "CPU per record of the observability hooks alone, against the processor's "
                   "CPU µs/cmd above")
    return [*figures, token_off, token_on, hooks]


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "child":
        child_main(sys.argv[2:])
    else:
        from bench.common import broker

        parser = argparse.ArgumentParser()
        parser.add_argument("--threads", type=int, default=1000)
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--token-seconds", type=float, default=15)
        parser.add_argument("--out", default=str(VAR / "bench-observability.json"))
        options = parser.parse_args()
        started = time.time()
        with broker() as bootstrap:
            print(f"load average before: {load_text()}", flush=True)
            found = run(bootstrap, threads=options.threads, repeats=options.repeats,
                        token_seconds=options.token_seconds)
            print(f"load average after: {load_text()}", flush=True)
        for figure in found:
            print(f"{figure.case:40s} {figure.values} load {figure.load}")
        Path(options.out).write_text(json.dumps({"seconds": time.time() - started,
                                                 "figures": [f.to_json() for f in found]}, indent=1))
