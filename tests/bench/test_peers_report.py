"""The peers' section of docs/benchmarks.md survives `make bench` rewriting the file."""

from pathlib import Path

from bench.peers.report import BEGIN, END, keep_section, tables
from bench.peers.report import NOTES as PEERS_NOTES
from bench.report import NOTES as BENCH_NOTES

ROOT = Path(__file__).resolve().parents[2]


def test_a_rewritten_report_keeps_the_peers_section() -> None:
    """The section of the old file is carried to the end of the new one, once."""
    old = f"# Benchmarks\n\nold tables\n\n{BEGIN}\n## Peers\n| x |\n{END}\n\nnotes\n"
    new = "# Benchmarks\n\nnew tables\n"
    kept = keep_section(old, new)
    assert kept.startswith(new.rstrip())
    assert kept.count(BEGIN) == 1 and f"{BEGIN}\n## Peers\n| x |\n{END}" in kept
    assert keep_section(kept, kept) == kept
    assert keep_section(new, new) == new


def test_the_hand_written_notes_of_docs_benchmarks_live_beside_the_code() -> None:
    """docs/benchmarks.md is written by `make bench` and `make bench-peers`, with the
    hand-written notes taken from bench/NOTES.md and bench/peers/NOTES.md: a note
    written into the doc alone is lost at the next run (four sections and the #22
    hop-by-hop notes were, once). Each notes file must be in the doc as it is."""
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    assert BEGIN in doc and END in doc
    before, peers = doc.split(BEGIN, 1)
    assert before.rstrip().endswith(BENCH_NOTES.read_text().rstrip()), \
        "docs/benchmarks.md's notes before the peers' section differ from bench/NOTES.md"
    assert PEERS_NOTES.read_text().rstrip() + "\n\n" + END in peers, \
        "the peers' notes in docs/benchmarks.md differ from bench/peers/NOTES.md"


def _round(**extra: object) -> dict[str, object]:
    return {"runs/s": 150.0, "CPU ms/run": 11.0, "CPU ms/run by process": {"worker": 3.0},
            "JIT compiler CPU ms/run": 0.5, "throughput answered": "200/200",
            "throughput load": "1.0 1.0 1.0", "latency p50 s": 0.84, "latency p99 s": 0.87,
            "latency answered": "50/50", "latency load": "1.0 1.0 1.0", "step p50 ms": 40.0,
            "step p99 ms": 100.0, "step p50 ms (burst)": 45.0, "step p99 ms (burst)": 110.0,
            "step p50 ms (paced)": 2.0, "step p99 ms (paced)": 6.0, "steps measured": 750,
            "post to first call p50 ms (paced)": 14.0, "last call to answer p50 ms (paced)": 20.0,
            "repeated calls": 0, **extra}


def test_a_process_that_exited_by_itself_is_reported_where_it_did() -> None:
    """The harness starts again a role that exited by itself (bench/peers/threadline.py),
    so its figures go on; the report says so, with the round or the kill test it came in."""
    recovery = {"role": "broker", "runs": 20, "in flight at kill": 20, "restarted after s": 0.0,
                "serving again s": 4.2, "runs moving again s": 4.5, "every run done s": 6.0,
                "answered": "20/20", "repeated completed calls": 0,
                "repeated, done after the kill": 0, "calls cut off and made again": 20,
                "completed calls": 80, "expected calls": 80, "load": "1.0 1.0 1.0",
                "milestones": {}, "killed at ms": 0.0,
                "exited by themselves": ["processor (status 1)"]}
    results = {"systems": {"Threadline": {"rounds": [_round(), _round()],
                                          "recovery": [recovery]}}}
    text = "\n".join(tables(results))
    assert "exited by themselves" in text
    assert "Threadline, broker killed: processor (status 1)" in text
    quiet = {"systems": {"Threadline": {"rounds": [_round()], "recovery": []}}}
    assert "exited by themselves" not in "\n".join(tables(quiet))
