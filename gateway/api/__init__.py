"""The native JSON API.

    rest        threads (create, list, get, delete), user messages, cancel, messages
    interrupts  human in the loop: resume an interrupted run
    openapi     /openapi.json, the description of every native endpoint
"""
