"""Every schema change stays readable both ways (full compatibility) with its last version.

One exception, the documented evolution rule (docs/topics.md): a new record kind
may be appended to a union (a new command, event or stream part). New readers
read all old data; old readers read every new record that is not of the new
kind, and readers are upgraded before producers emit it.

The previous version of a file is the newest commit whose blob differs from the
working tree's file; its named types come from the `schemas/` tree of that same
commit. Data covering every union branch and enum symbol is written with one
version and read with the other through fastavro's schema resolution, and the
pair is also checked statically with Apache Avro's compatibility checker.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import avro.compatibility
import avro.schema
import fastavro
import pytest
from fastavro.schema import load_schema

from streams.wire import SCHEMA_DIR

REPO = SCHEMA_DIR.parent
# The core schemas and the connectors' (schemas/connectors/), each folder resolving
# its own named types.
SCHEMA_FILES = sorted(SCHEMA_DIR.glob("*.avsc")) + sorted((SCHEMA_DIR / "connectors").glob("*.avsc"))
SCHEMA_IDS = [p.relative_to(SCHEMA_DIR).with_suffix("").as_posix() for p in SCHEMA_FILES]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def _previous_commit(repo: Path, path: Path) -> str | None:
    """The newest commit whose version of `path` differs from the working tree's."""
    relative = path.relative_to(repo).as_posix()
    current = _git(repo, "hash-object", relative).strip()
    for commit in _git(repo, "log", "--format=%H", "--", relative).split():
        try:
            blob = _git(repo, "rev-parse", f"{commit}:{relative}").strip()
        except subprocess.CalledProcessError:  # deleted in that commit
            continue
        if blob != current:
            return commit
    return None


def _checkout_dir(repo: Path, commit: str, directory: Path, into: Path) -> Path:
    """The files of `directory` as they were at `commit`, written under `into`."""
    into.mkdir()
    relative = directory.relative_to(repo).as_posix()
    for line in _git(repo, "ls-tree", f"{commit}:{relative}").splitlines():
        kind, name = line.split()[1], line.split("\t", 1)[1]
        if kind == "blob":  # not the subfolders: each folder is a schema set of its own
            (into / name).write_text(_git(repo, "show", f"{commit}:{relative}/{name}"))
    return into


# --- data that exercises every branch of a schema ------------------------------


def _variants(
    schema: Any, named: dict[str, Any], depth: int = 0, known: frozenset[str] | None = None
) -> list[Any]:
    """Values of `schema` that together hit every union branch and enum symbol
    (only the record branches in `known`, when given)."""
    assert depth < 20, "recursive schema: give the generator a way out"
    if isinstance(schema, str):
        if schema in named:
            return _variants(named[schema], named, depth + 1, known)
        return [_PRIMITIVE[schema]]
    if isinstance(schema, list):
        values: list[Any] = []
        for branch in schema:
            name = branch if isinstance(branch, str) and branch in named else None
            if isinstance(branch, dict) and "name" in branch:
                name = branch["name"]
            if known is not None and name and _is_record(branch, named) and name not in known:
                continue
            for value in _variants(branch, named, depth + 1, known):
                # fastavro's tuple notation picks the branch by name, not by shape.
                values.append((name, value) if name and _is_record(branch, named) else value)
        return values
    kind = schema["type"]
    if kind == "record":
        per_field = [(f["name"], _variants(f["type"], named, depth + 1, known))
                     for f in schema["fields"]]
        count = max((len(v) for _, v in per_field), default=1)
        return [{n: v[i % len(v)] for n, v in per_field} for i in range(count)]
    if kind == "enum":
        return list(schema["symbols"])
    if kind == "array":
        items = _variants(schema["items"], named, depth + 1, known)
        return [[], items]
    if kind == "map":
        values = _variants(schema["values"], named, depth + 1, known)
        return [{}, {f"k{i}": v for i, v in enumerate(values)}]
    if kind == "fixed":
        return [bytes(schema["size"])]
    return _variants(kind, named, depth + 1)  # {"type": "string"} and the like


def _is_record(branch: Any, named: dict[str, Any]) -> bool:
    definition = named.get(branch, branch) if isinstance(branch, str) else branch
    return isinstance(definition, dict) and definition.get("type") == "record"


_PRIMITIVE: dict[str, Any] = {
    "null": None, "boolean": True, "int": -7, "long": 2**40, "float": 1.5,
    "double": 2.5, "bytes": b"\x00\xff", "string": "sé",
}


def _check_reads(writer: Any, reader: Any, known: frozenset[str] | None = None) -> None:
    """Everything `writer` can write, fastavro reads with `reader`; Apache agrees statically.

    With `known`, only records whose union branches are all in `known` are tried,
    and the static check (which judges whole schemas) is left out."""
    for datum in _variants(writer, writer.get("__named_schemas", {}), known=known):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, writer, datum)
        out.seek(0)
        fastavro.schemaless_reader(out, writer, reader)
        assert out.tell() == len(out.getvalue())
    if known is not None:
        return
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(_apache(reader), _apache(writer))
    assert result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible, (
        result.messages
    )


def _apache(parsed: Any) -> avro.schema.Schema:
    return avro.schema.parse(json.dumps({k: v for k, v in parsed.items() if k[:2] != "__"}))


def _check_full(old: Path, new: Path) -> None:
    old_schema, new_schema = load_schema(str(old)), load_schema(str(new))
    _check_reads(old_schema, new_schema)  # new code reads old data
    assert isinstance(old_schema, dict) and isinstance(new_schema, dict)  # a named record each
    old_names = frozenset(old_schema.get("__named_schemas", {}))
    new_names = frozenset(new_schema.get("__named_schemas", {}))
    added = new_names - old_names
    # old code reads new data, except records of a newly appended kind
    _check_reads(new_schema, old_schema, known=old_names if added else None)


# --- the checks ------------------------------------------------------------------


HISTORY_FILES = sorted((SCHEMA_DIR / "history").glob("*.avsc"))


def test_every_schema_file_is_checked() -> None:
    """Every schema file is either checked for compatibility or a kept old version."""
    assert set(SCHEMA_FILES) | set(HISTORY_FILES) == set(SCHEMA_DIR.rglob("*.avsc"))


@pytest.mark.parametrize("path", HISTORY_FILES, ids=lambda p: p.stem)
def test_a_retired_schema_is_frozen_under_its_fingerprint(path: Path) -> None:
    """schemas/history/ keeps the writer schemas of records already on the topics:
    each file is named by its top-level record and its fingerprint, so an edit that
    would leave such records unreadable fails here."""
    from fastavro import parse_schema

    from streams.wire import TOP_LEVEL_SCHEMAS, schema_fingerprint

    name, fingerprint = path.stem.rsplit("-", 1)
    assert name in TOP_LEVEL_SCHEMAS
    assert schema_fingerprint(parse_schema(json.loads(path.read_text()))).hex() == fingerprint


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=SCHEMA_IDS)
def test_schema_is_fully_compatible_with_its_previous_version(
    path: Path, tmp_path: Path
) -> None:
    """Each schema is fully compatible (both ways) with its last committed version."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no history to compare with")
    commit = _previous_commit(REPO, path)
    if commit is None:
        pytest.skip(f"{path.name} has no earlier committed version that differs")
    old_dir = _checkout_dir(REPO, commit, path.parent, tmp_path / "old")
    if not (old_dir / path.name).exists():
        pytest.skip(f"{path.name} did not exist at {commit[:12]}")
    _check_full(old_dir / path.name, path)


def _changed(tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None],
             source: Path = SCHEMA_DIR) -> Path:
    """A copy of `source` (schemas/) with `change` applied to the schema `name`."""
    directory = tmp_path / "new"
    shutil.copytree(source, directory)
    path = directory / f"{name}.avsc"
    schema = json.loads(path.read_text())
    change(schema)
    path.write_text(json.dumps(schema))
    return directory


ENVELOPE = "threadline.CommandEnvelope.avsc"


def test_the_check_passes_an_optional_field_with_a_default(tmp_path: Path) -> None:
    """The check passes a new optional field with a null default."""
    new = _changed(tmp_path, "threadline.CreateThread", lambda s: s["fields"].append(
        {"name": "compat_probe", "type": ["null", "string"], "default": None}
    ))
    _check_full(SCHEMA_DIR / ENVELOPE, new / ENVELOPE)


def test_the_check_fails_a_new_required_field(tmp_path: Path) -> None:
    """The check fails a new field without a default."""
    new = _changed(tmp_path, "threadline.CreateThread", lambda s: s["fields"].append(
        {"name": "compat_probe", "type": "string"}  # no default: old records cannot be read
    ))
    with pytest.raises(Exception, match="compat_probe"):
        _check_full(SCHEMA_DIR / ENVELOPE, new / ENVELOPE)


def test_the_check_fails_a_connector_schema_that_gains_a_required_field(tmp_path: Path) -> None:
    """The check covers the connector schemas too: a new required field fails."""
    connectors = SCHEMA_DIR / "connectors"
    new = _changed(tmp_path, "threadline.OutboxEntry", lambda s: s["fields"].append(
        {"name": "compat_probe", "type": "string"}), source=connectors)
    outbox = "threadline.ChatOutbox.avsc"
    _check_full(connectors / outbox, connectors / outbox)
    with pytest.raises(Exception, match="compat_probe"):
        _check_full(connectors / outbox, new / outbox)


def test_the_check_fails_a_new_enum_symbol_old_readers_do_not_know(tmp_path: Path) -> None:
    """A new enum symbol reads old data fine but fails old readers of new data."""
    new = _changed(tmp_path, "threadline.RejectReason", lambda s: s["symbols"].append(
        "rate_limited"
    ))
    old = load_schema(str(SCHEMA_DIR / "threadline.RunRejected.avsc"))
    newer = load_schema(str(new / "threadline.RunRejected.avsc"))
    _check_reads(old, newer)  # new code reads old data: fine
    with pytest.raises(Exception, match="rate_limited"):
        _check_reads(newer, old)  # old code reads new data: it cannot


def test_previous_version_is_found_in_git_history(tmp_path: Path) -> None:
    """The history walk itself, on a scratch repository with two versions of a file."""
    repo = tmp_path / "repo"
    (repo / "schemas").mkdir(parents=True)
    config = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]

    def commit(text: str) -> str:
        target.write_text(text)
        _git(repo, "add", ".")
        _git(repo, *config, "commit", "-qm", text)
        return _git(repo, "rev-parse", "HEAD").strip()

    _git(repo, "init", "-q")
    target = repo / "schemas" / "x.avsc"
    first, second = commit("1"), commit("2")
    assert _previous_commit(repo, target) == first  # unchanged since 2: 1 is the previous
    target.write_text("3")
    assert _previous_commit(repo, target) == second  # edited: the last commit is the previous
    old = _checkout_dir(repo, second, repo / "schemas", tmp_path / "old")
    assert (old / "x.avsc").read_text() == "2"


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=SCHEMA_IDS)
def test_every_schema_is_compatible_with_itself(path: Path) -> None:
    """The generator and both checks handle every file, so real pairs will be checked."""
    _check_full(path, path)
