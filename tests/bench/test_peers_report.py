"""The peers' section of docs/benchmarks.md survives `make bench` rewriting the file."""

from pathlib import Path

from bench.peers.report import BEGIN, END, keep_section
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
