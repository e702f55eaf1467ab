"""The dataclass <-> Avro record binding, derived once per class.

Records mirror their dataclasses field for field (`streams.core.domain`,
`streams.core.records`, `streams.connectors`): a field fastavro takes as it is is
copied; tuples, frozen maps, optionals, enums, nested records and unions of
records are converted. A union of records is written in fastavro's
`("threadline.<Class>", record)` tuple notation, which is what the compiled
reader (`streams.wire.reader`) gives back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from enum import Enum
from types import MappingProxyType, UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from streams.wire.compiled import compile_source

__all__ = ["NAMESPACE", "Binding", "avro_name", "binding_of", "record_union"]

NAMESPACE = "threadline"

_Convert = Callable[[Any], Any]


class Binding:
    """One dataclass and its Avro record: fields copied as they are, and converted.

    `to_avro` and `from_avro` are compiled once per class into straight-line code
    (a dict display, a constructor call): the processor converts several records
    per command, and a loop over the fields with getattr cost twice as much."""

    __slots__ = ("cls", "converted", "from_avro", "plain", "to_avro")

    to_avro: Callable[[Any], dict[str, Any]]
    from_avro: Callable[[Mapping[str, Any]], Any]

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        hints = get_type_hints(cls)
        plain: list[str] = []
        converted: list[tuple[str, _Convert, _Convert]] = []
        _BINDINGS[cls] = self  # before the fields, so recursive types terminate
        for f in fields(cls):
            conversion = _conversion(hints[f.name])
            if conversion is None:
                plain.append(f.name)
            else:
                converted.append((f.name, *conversion))
        self.plain = tuple(plain)
        self.converted = tuple(converted)
        self._compile()

    def _compile(self) -> None:
        # Field names are the dataclass's own identifiers, so the source is safe.
        namespace: dict[str, Any] = {"_cls": self.cls}
        encode = [f"{name!r}: o.{name}" for name in self.plain]
        decode = [f"{name}=r[{name!r}]" for name in self.plain]
        for i, (name, to_avro, from_avro) in enumerate(self.converted):
            namespace[f"_e{i}"], namespace[f"_d{i}"] = to_avro, from_avro
            encode.append(f"{name!r}: _e{i}(o.{name})")
            decode.append(f"{name}=_d{i}(r[{name!r}])")
        source = (f"def to_avro(o):\n    return {{{', '.join(encode)}}}\n"
                  f"def from_avro(r):\n    return _cls({', '.join(decode)})\n")
        exec(compile_source(source, f"<avro binding of {self.cls.__name__}>"), namespace)
        self.to_avro = namespace["to_avro"]
        self.from_avro = namespace["from_avro"]


# A cache of pure derivations from class definitions, not configuration: a class
# has one binding whoever asks.
_BINDINGS: dict[type[Any], Binding] = {}
_PLAIN_TYPES = (str, int, bool, float, bytes, type(None))


def binding_of(cls: type[Any]) -> Binding:
    """The binding of a dataclass, compiled on first use."""
    return _BINDINGS.get(cls) or Binding(cls)


def avro_name(cls: type[Any]) -> str:
    """The Avro full name of the record bound to `cls`."""
    return f"{NAMESPACE}.{cls.__name__}"


def _conversion(tp: Any) -> tuple[_Convert, _Convert] | None:
    """(to Avro, from Avro) for a field type, or None if fastavro takes it as it is."""
    if tp in _PLAIN_TYPES:
        return None
    origin, args = get_origin(tp), get_args(tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _conversion(args[0])
        if item is None:
            return list, tuple
        enc, dec = item
        return (lambda v: [enc(x) for x in v]), (lambda v: tuple(dec(x) for x in v))
    if origin is Mapping and args[0] is str:  # frozen maps: MappingProxyType
        value = _conversion(args[1])
        if value is None:
            return dict, lambda v: MappingProxyType(v)
        enc, dec = value
        return (lambda v: {k: enc(x) for k, x in v.items()}), (
            lambda v: MappingProxyType({k: dec(x) for k, x in v.items()})
        )
    if origin in (UnionType, Union):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # Optional: ["null", T]
            inner = _conversion(members[0])
            if inner is None:
                return None
            enc, dec = inner
            if isinstance(members[0], type) and is_dataclass(members[0]):
                # Named, so fastavro writes the branch it names: given a bare dict, it
                # validates the whole record against the branch first (nested records
                # and all), which was most of the cost of writing a thread's state.
                name = avro_name(members[0])
                return (lambda v: None if v is None else (name, enc(v))), (
                    lambda v: None if v is None else dec(v)
                )
            return (lambda v: None if v is None else enc(v)), (
                lambda v: None if v is None else dec(v)
            )
        records = all(isinstance(m, type) and is_dataclass(m) for m in members)
        if records and len(members) == len(args):
            return record_union(members)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return (lambda e: e.value), tp  # Avro symbols are the enum values
    if isinstance(tp, type) and is_dataclass(tp):
        binding = binding_of(tp)
        if not hasattr(binding, "to_avro"):  # a recursive type, still being compiled
            return (lambda v: binding.to_avro(v)), (lambda v: binding.from_avro(v))
        return binding.to_avro, binding.from_avro
    raise TypeError(f"no Avro mapping for the field type {tp!r}")


def record_union(members: list[type[Any]]) -> tuple[_Convert, _Convert]:
    """(to Avro, from Avro) of a union of records, in fastavro's ("name", record) notation."""
    by_class = {m: (avro_name(m), binding_of(m).to_avro) for m in members}
    by_name = {avro_name(m): binding_of(m).from_avro for m in members}

    def encode(value: Any) -> tuple[str, dict[str, Any]]:
        try:
            name, to_avro = by_class[type(value)]
        except KeyError:
            raise TypeError(f"{type(value).__name__} is not one of {sorted(by_name)}") from None
        return name, to_avro(value)

    def decode(value: tuple[str, Mapping[str, Any]]) -> Any:
        name, record = value
        return by_name[name](record)

    return encode, decode
