"""The Kafka runtime: what every role needs of Kafka, apart from what the role does.

- `clients`: client configurations (bootstrap, TLS and SASL, the table loop's clients);
- `topics`: creating and checking the declared topics;
- `state_store`: per-partition RocksDB tables that only hold committed state;
- `restore`: reading a changelog to its end on assignment;
- `loop`: the transactional consume -> process -> produce -> commit loop.

The roles (`streams.processor`, `streams.connectors.relay`) supply what to do
with the records; this package owns the ordering that makes it exactly once.
"""
