"""What the gateway knows and what it writes: the read model and the command bus.

    read_model  threads and messages from a local store, restored from the
                changelogs, with read-your-writes catch-up
    read_store  that RocksDB store
    decisions   the command producer, and the events consumer that answers the
                requests waiting for their decision
"""
