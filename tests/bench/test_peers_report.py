"""The peers' section of docs/benchmarks.md survives `make bench` rewriting the file."""

from bench.peers.report import BEGIN, END, keep_section


def test_a_rewritten_report_keeps_the_peers_section() -> None:
    """The section of the old file is carried to the end of the new one, once."""
    old = f"# Benchmarks\n\nold tables\n\n{BEGIN}\n## Peers\n| x |\n{END}\n\nnotes\n"
    new = "# Benchmarks\n\nnew tables\n"
    kept = keep_section(old, new)
    assert kept.startswith(new.rstrip())
    assert kept.count(BEGIN) == 1 and f"{BEGIN}\n## Peers\n| x |\n{END}" in kept
    assert keep_section(kept, kept) == kept
    assert keep_section(new, new) == new
