"""`streams.wire.compiled.compile_source`: the generated Avro code's code objects
kept as a .pyc keeps a module's (see its module)."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path
from typing import Any

import pytest

from streams.wire import compiled
from streams.wire.compiled import compile_source

SOURCE = "def f(x):\n    return x * 2\n"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache in a folder of the test's, writes allowed whatever PYTHONDONTWRITEBYTECODE."""
    folder = tmp_path / "__pycache__"
    monkeypatch.setattr(compiled, "_cache_folder", lambda: folder)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    return folder


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names `compile` is called with from here on."""
    calls: list[str] = []
    real = builtins.compile

    def counting(source: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(str(filename))
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(compiled, "compile", counting, raising=False)
    return calls


def _run(code: Any) -> Any:
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    return namespace["f"](21)


def test_a_source_compiled_once_is_read_back_from_the_cache(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second start reads the code object back: `compile` is called once, the
    code is the same, and the entry is readable by all, as a .pyc is (an image writes
    them as root for roles that run as another user)."""
    calls = _compiles(monkeypatch)
    first = compile_source(SOURCE, "<avro test>")
    second = compile_source(SOURCE, "<avro test>")
    (entry,) = cache.glob("avro-*.bin")
    assert calls == ["<avro test>"] and entry.stat().st_mode & 0o777 == 0o644
    assert second == first and second.co_filename == "<avro test>" and _run(second) == 42


def test_another_source_or_file_name_is_another_entry(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry's name is the source's and the file name's digest: a changed
    schema's code is never an older entry."""
    calls = _compiles(monkeypatch)
    compile_source(SOURCE, "<avro test>")
    other = compile_source(SOURCE.replace("2", "3"), "<avro test>")
    renamed = compile_source(SOURCE, "<avro other>")
    assert len(calls) == 3 and len(list(cache.glob("avro-*.bin"))) == 3
    assert _run(other) == 63 and renamed.co_filename == "<avro other>"


def test_a_damaged_entry_is_compiled_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated or garbled entry (a crash mid-write elsewhere, a disk error) is compiled anew."""
    compile_source(SOURCE, "<avro test>")
    (entry,) = cache.glob("avro-*.bin")
    entry.write_bytes(b"\x00garbage")
    calls = _compiles(monkeypatch)
    assert _run(compile_source(SOURCE, "<avro test>")) == 42 and calls == ["<avro test>"]
    entry.write_bytes(b"")
    assert _run(compile_source(SOURCE, "<avro test>")) == 42


def test_nothing_is_written_where_bytecode_is_not(
        cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PYTHONDONTWRITEBYTECODE (sys.dont_write_bytecode) is honoured as for a .pyc."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert _run(compile_source(SOURCE, "<avro test>")) == 42
    assert not cache.exists()


def test_an_unwritable_cache_compiles_all_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder that cannot be made (a read-only install) costs only the compile."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(compiled, "_cache_folder", lambda: blocker / "__pycache__")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert _run(compile_source(SOURCE, "<avro test>")) == 42
