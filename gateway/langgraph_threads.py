"""The former name of `gateway.langgraph.threads`, kept for the imports that use it: the same module
object (so a monkeypatch of either name is seen by both)."""

import importlib
import sys

from gateway.langgraph.threads import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = importlib.import_module("gateway.langgraph.threads")
