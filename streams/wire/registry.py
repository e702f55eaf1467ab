"""The Confluent schema registry client the codec registers and looks up schemas with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from streams.wire.errors import RegistryError

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["ConfluentRegistry"]

_REGISTER_ATTEMPTS = 6  # a race's 409, a 5xx or a timeout is retried this often

T = TypeVar("T")


class ConfluentRegistry:
    """The schema registry, through `confluent_kafka.schema_registry`'s client.

    Blocking: the client caches ids both ways, so each schema costs one request
    per process. Call `Codec.register_schemas` at start-up, off the event loop
    (`asyncio.to_thread` in the asyncio roles), to keep requests off the hot path.
    Any registry with the Confluent REST API will do (Apicurio Registry's is at
    `/apis/ccompat/v7`, which the tests run).
    """

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        # Imported here: the client brings authlib and httpx, a third of a role's
        # start-up, which a deployment without a registry never needs (restarts are
        # on the clock of recovery, docs/operations.md).
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._client: SchemaRegistryClient = SchemaRegistryClient({
            "url": self.url, "timeout": max(1, round(timeout_s)), "max.retries": 2,
        })

    def register(self, subject: str, schema: str) -> int:
        """The id of `schema` (JSON text) under `subject`, registering it if new.

        Roles start together and register the same schemas: Apicurio answers the
        loser of a race to create a subject 409 "already exists" (seen with the
        processor, worker and gateway starting at once); asked again, it answers
        the id. Registrations at once can also make it answer 500 (its H2 store's
        lock timed out) or time out: transient, so retried with a growing pause. A
        4xx other than 409, or any error that persists, is raised."""
        from confluent_kafka.schema_registry import Schema

        for attempt in range(_REGISTER_ATTEMPTS):
            try:
                return self._call(f"register {subject}", lambda: self._client.register_schema(
                    subject, Schema(schema, "AVRO")))
            except RegistryError as exc:
                transient = exc.status is None or exc.status == 409 or exc.status >= 500
                if not transient or attempt == _REGISTER_ATTEMPTS - 1:
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")

    def lookup(self, schema_id: int) -> str:
        """The schema (JSON text) registered under `schema_id`."""
        found = self._call(f"schema id {schema_id}", lambda: self._client.get_schema(schema_id))
        return str(found.schema_str)

    def _call(self, what: str, call: Callable[[], T]) -> T:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return call()
        except SchemaRegistryError as exc:
            status = exc.http_status_code if exc.http_status_code > 0 else None
            raise RegistryError(f"{what}: {exc}", status) from exc
        except Exception as exc:  # connection refused, timeouts: the HTTP layer's own errors
            raise RegistryError(f"{what}: {type(exc).__name__}: {exc}") from exc
