"""Typed sections of the environment: each option's variable, type, bounds and default, once.

A section is a frozen pydantic model whose fields are the THREADLINE_* variables of one
role or concern, in the variable's own units (seconds where the name ends in `_S`).
`Section.read(env)` validates the variables present in `env`; an unset or empty
variable takes the field's default, and a bad value raises `SettingsError` naming the
variable. The runtime objects (`streams.config.Settings`, `ObservabilitySettings`, the
gateway's `Options`) are built from sections, so a default lives in one place.
docs/operations.md lists every variable; tests/streams/test_settings_doc.py checks it
against the sections.

Why pydantic and not pydantic-settings: every `from_env` here takes an explicit mapping
(the process environment plus a test's overrides, never a mutated `os.environ`), and our
variables are case-sensitive with comma lists, where pydantic-settings reads `os.environ`
itself, folds case and parses lists as JSON. Validating the mapping is all we need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Section", "SettingsError", "parse_list", "parse_pairs"]


class SettingsError(ValueError):
    """A variable of the environment has a value its option does not accept."""


class Section(BaseModel):
    """The variables of one role or concern; fields are aliased to their variable names."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=False)

    # Variables whose empty value is a value (a topic prefix of ""), not "unset".
    keep_empty: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def variables(cls) -> tuple[str, ...]:
        """The names of this section's variables, in declaration order."""
        return tuple(field.alias or name for name, field in cls.model_fields.items())

    @classmethod
    def read(cls, env: Mapping[str, str]) -> Self:
        """This section from `env`: unset and empty variables take their defaults."""
        present = {name: env[name] for name in cls.variables()
                   if name in env and (env[name] != "" or name in cls.keep_empty)}
        try:
            return cls.model_validate(present)
        except ValidationError as error:
            raise SettingsError("; ".join(_explain(problem, present)
                                          for problem in error.errors())) from None


def _explain(problem: Any, present: Mapping[str, str]) -> str:
    message = str(problem["msg"]).removeprefix("Value error, ")
    if not problem["loc"]:  # a rule across variables names them itself
        return message
    name = str(problem["loc"][0])
    return f"{name}={present.get(name)!r}: {message}"


def parse_pairs(raw: object) -> object:
    """`a=x,b=y` as {"a": "x", "b": "y"}; blanks between commas are skipped."""
    if not isinstance(raw, str):
        return raw
    pairs: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        key, _, value = pair.partition("=")
        if not key or not value:
            raise ValueError(f"entry {pair!r} is not key=tenant")
        pairs[key] = value
    return pairs


def parse_list(raw: object) -> object:
    """`a, b` as ("a", "b"); blanks between commas are skipped."""
    if not isinstance(raw, str):
        return raw
    return tuple(item.strip() for item in raw.split(",") if item.strip())
