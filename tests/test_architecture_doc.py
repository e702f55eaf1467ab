"""docs/architecture.md's picture of the house matches the tree, folder for folder."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def house_picture() -> str:
    """The code block under "## The house" of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("## The house", 1)[1].split("```", 2)[1]


def packages(top: str) -> list[str]:
    """Every package folder under `top`, as `top/a/b/`."""
    return sorted(f"{p.parent.relative_to(ROOT)}/" for p in (ROOT / top).rglob("__init__.py")
                  if p.parent != ROOT / top)


def test_the_picture_names_every_package() -> None:
    """Each package of streams/ is drawn by its path; each of gateway/ by its name under
    `gateway/`, as the picture nests them."""
    picture = house_picture()
    missing = [p for p in packages("streams") if p not in picture]
    missing += [p for p in packages("gateway")
                if not re.search(rf"(?<![\w/]){re.escape(p.removeprefix('gateway/').split('/')[-2])}/",
                                 picture)]
    assert missing == []


def test_every_folder_the_picture_names_exists() -> None:
    """No folder of streams/ in the picture is gone from the tree."""
    named = set(re.findall(r"streams/[a-z_]+/", house_picture()))
    assert named and [n for n in sorted(named) if not (ROOT / n).is_dir()] == []
