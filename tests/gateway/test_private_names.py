"""No module of streams/ or gateway/ imports another module's private name.

Ruff's PLC2701 finds a private name imported from another package only, and SLF001
finds `module._name` used as an attribute; this finds `from gateway.api.rest import _body`
inside gateway/ as well (pyproject.toml's ruff config has the rest)."""

from __future__ import annotations

import ast
import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streams", "gateway")
FIRST_PARTY = ("streams", "gateway", "schemas", "chaos", "bench", "tests")


def _parse(source: str, where: str) -> ast.Module:
    """`ast.parse`, guarded against CPython 3.11.7's "AST constructor recursion depth
    mismatch" (gh-106905). On a thread of its own: the recursion limit may have changed
    while the calling thread was deep in a stack (hypothesis changes it), as in an xdist
    worker after a property test; a fresh thread starts its count at zero. With no
    cyclic collection meanwhile: the depth is kept per interpreter, and a collection
    during the parse can run a finalizer that parses too (it failed so once more, in
    tests/gateway with the thread alone; tests/chaos/test_bad_input.py does the same)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(ast.parse, source, where).result()
    finally:
        if enabled:
            gc.enable()


def private_imports(source: str, where: str) -> list[str]:
    """`where:line name` of each private name `source` imports from a first-party module."""
    found = []
    tree = _parse(source, where)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] not in FIRST_PARTY:
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
                found.append(f"{where}:{node.lineno} {module}.{name}")
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """Shared pieces have public names (e.g. gateway.http.plumbing), not borrowed private ones."""
    found = [hit for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for hit in private_imports(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


def test_the_check_sees_a_seeded_private_import() -> None:
    """A seeded private import is found, absolute or relative (so the check can fail);
    a dunder or a third-party private name is not this check's (ruff's PLC2701 is)."""
    seeded = ("from gateway.api.rest import _string, __all__\nfrom .rest import _limit\n"
              "from fastavro._write import write_data\n")
    assert private_imports(seeded, "gateway/seeded.py") == [
        "gateway/seeded.py:1 gateway.api.rest._string", "gateway/seeded.py:2 rest._limit"]


ADAPTERS = ("gateway.adapters.ai_sdk", "gateway.adapters.console", "gateway.adapters.langgraph")


def adapter_imports(source: str, where: str, package: str) -> list[str]:
    """`where:line module` of each import of another adapter than `package` in `source`."""
    found = []
    tree = _parse(source, where)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            other = next((a for a in ADAPTERS if a != package and
                          (name == a or name.startswith(a + "."))), None)
            if other is not None:
                found.append(f"{where}:{node.lineno} {other}")
                break
    return found


def test_adapters_do_not_import_each_other() -> None:
    """Each protocol adapter (a sub-app package) speaks to the gateway's public API only."""
    found = [hit for package in ADAPTERS
             for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
             for hit in adapter_imports(path.read_text(), str(path.relative_to(ROOT)), package)]
    assert found == []
    seeded = "from gateway.adapters import langgraph\nfrom gateway.adapters.ai_sdk.chat import chat\n"
    assert adapter_imports(seeded, "gateway/adapters/console/x.py", "gateway.adapters.console") == [
        "gateway/adapters/console/x.py:1 gateway.adapters.langgraph",
        "gateway/adapters/console/x.py:2 gateway.adapters.ai_sdk"]
