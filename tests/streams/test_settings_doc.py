"""docs/operations.md lists every option, and the code reads every option it lists.

The code's options are the fields of the settings sections (`streams.env.Section`) plus
any THREADLINE_* name in the source of streams/ and gateway/, docstrings included (an
agent's own variables, read from `Settings.extra`; development switches), and in
docker-compose.yml (Compose's own). A section's row must also give the type, bounds and
default the section declares, so the table cannot keep an old default.
"""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic.fields import FieldInfo

from gateway.keys import OptionsEnv
from streams.agents.builtin import BuiltinAgentEnv
from streams.agents.example import TicketAgentEnv
from streams.agents.mcp import MCPEnv
from streams.agents.openai import OpenAIAgentEnv
from streams.config import ENV_SECTIONS
from streams.connectors.config import ConnectorEnv
from streams.env import Section

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operations.md"
SECTIONS: tuple[type[Section], ...] = (*ENV_SECTIONS, OptionsEnv, ConnectorEnv, BuiltinAgentEnv,
                                        OpenAIAgentEnv, TicketAgentEnv, MCPEnv)
# A variable named in the code; a name ending in "_" is a prefix (THREADLINE_AGENT_*), not one.
NAMED = re.compile(r"\bTHREADLINE_[A-Z0-9_]*[A-Z0-9]\b")
NAME_CELL = re.compile(r"`((?:THREADLINE|KAFKA)_[A-Z0-9_]+)`")
CELL_EDGE = re.compile(r"(?<!\\)\|")  # an escaped \| is inside a cell (`a` \| `b`)


def documented(text: str) -> dict[str, tuple[str, str]]:
    """The variables of the doc's "Settings" part: name -> (type cell, default cell)."""
    part = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in CELL_EDGE.split(line)[1:-1]]
            for line in part.splitlines() if line.startswith("|")]
    return {name[1]: (row[1], row[2]) for row in rows
            if len(row) == 4 and (name := NAME_CELL.fullmatch(row[0]))}


def named_in_code() -> set[str]:
    """Every THREADLINE_* name in the source of streams/ and gateway/, and in docker-compose.yml."""
    paths = [*(REPO / "streams").rglob("*.py"), *(REPO / "gateway").rglob("*.py"),
             REPO / "docker-compose.yml"]
    return {name for path in paths for name in NAMED.findall(path.read_text())}


def declared() -> dict[str, FieldInfo]:
    """Every variable of a settings section, with its field."""
    return {field.alias or name: field for section in SECTIONS
            for name, field in section.model_fields.items()}


def type_cell(field: FieldInfo) -> str:
    """How the doc writes a field's type and bounds, e.g. `int > 0`, `float 0..1`."""
    kind = _kind(field.annotation)
    bounds: dict[str, Any] = {}
    for m in field.metadata:
        if isinstance(m, annotated_types.Gt):
            bounds[">"] = m.gt
        elif isinstance(m, annotated_types.Ge):
            bounds[">="] = m.ge
        elif isinstance(m, annotated_types.Le):
            bounds["<="] = m.le
    if ">=" in bounds and "<=" in bounds:
        return f"{kind} {_number(bounds['>='])}..{_number(bounds['<='])}"
    return " ".join([kind, *(f"{sign} {_number(v)}" for sign, v in bounds.items())])


def _kind(annotation: Any) -> str:
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if get_origin(annotation) is dict:
        return "`key=tenant,...`"
    if get_origin(annotation) is tuple:
        return "comma list"
    return {int: "int", float: "float", str: "str", bool: "bool", Path: "path"}[annotation]


def default_cell(field: FieldInfo) -> str:
    """How the doc writes a field's default: `12`, `2.5`, `on`, or unset."""
    value = field.get_default(call_default_factory=True)
    if value in (None, "", (), {}):
        return "unset"
    if isinstance(value, bool):
        return "`on`" if value else "`off`"
    return f"`{_number(value) if isinstance(value, float) else value}`"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def test_every_variable_in_the_code_is_documented() -> None:
    """A variable the code reads or names, missing from docs/operations.md, fails here."""
    missing = (set(declared()) | named_in_code()) - set(documented(DOC.read_text()))
    assert not missing, f"in the code, not in docs/operations.md's Settings: {sorted(missing)}"


def test_every_documented_variable_is_in_the_code() -> None:
    """A row of docs/operations.md that names no variable of the code fails here."""
    stale = set(documented(DOC.read_text())) - set(declared()) - named_in_code()
    assert not stale, f"in docs/operations.md's Settings, not in the code: {sorted(stale)}"


def test_the_doc_gives_each_section_variable_its_type_and_default() -> None:
    """The type, bounds and default of each row are the ones its section declares."""
    rows = documented(DOC.read_text())
    wrong = {name: {"doc": rows[name], "code": (type_cell(field), default_cell(field))}
             for name, field in declared().items()
             if name in rows and rows[name] != (type_cell(field), default_cell(field))}
    assert not wrong, wrong


def test_the_sections_are_found() -> None:
    """Shows the checks above see the sections and the names in the code (not empty sets)."""
    assert len(declared()) > 80 and "THREADLINE_PARTITIONS" in declared()
    assert "THREADLINE_AGENT_OPENAI_MODEL" in named_in_code()
