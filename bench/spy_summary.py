"""Summarise a py-spy raw profile (`py-spy record --format raw`) by function.

    python -m bench.spy_summary PROFILE.raw [own-rows] [inclusive-rows]

Prints each frame's share of the samples, on its own ("own") and with what it
called ("inclusive"). How the py-spy profiles in docs/profiles/ were summarised.
"""

from __future__ import annotations

import sys
from collections import Counter


def summarise(path: str, own_rows: int = 20, inclusive_rows: int = 30) -> str:
    """The functions that took the most samples in a py-spy raw profile, own and inclusive."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(path) as lines:
        for line in lines:
            line = line.strip()
            if " " not in line:
                continue
            stack, count = line.rsplit(" ", 1)
            n = int(count)
            total += n
            frames = stack.split(";")
            own[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    out = [f"total samples {total}", "-- own"]
    out += [f"{n / total * 100:5.1f}%  {f[:150]}" for f, n in own.most_common(own_rows)]
    out.append("-- inclusive")
    out += [f"{n / total * 100:5.1f}%  {f[:150]}" for f, n in inclusive.most_common(inclusive_rows)]
    return "\n".join(out)


if __name__ == "__main__":
    args = sys.argv[1:]
    print(summarise(args[0], *(int(a) for a in args[1:3])))
