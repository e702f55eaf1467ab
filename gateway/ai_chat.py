"""The former name of `gateway.ai_sdk.chat`, kept for the imports that use it: the same module
object (so a monkeypatch of either name is seen by both)."""

import importlib
import sys

from gateway.ai_sdk.chat import *  # noqa: F403  (the names, for type checkers)

sys.modules[__name__] = importlib.import_module("gateway.ai_sdk.chat")
