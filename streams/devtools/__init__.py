"""Development and test infrastructure, not the runtime. No role imports it;
`streams/cli.py` does, lazily, when `threadline run` or `threadline broker` starts
the embedded broker, and so does the testing kit (`streams/testing/`).

    broker           the embedded Apache Kafka (KRaft, single node or three), fetched
                     from Maven Central, for `threadline run`/`broker`, the tests, the
                     chaos program and the benchmarks
    registry_server  an Apicurio schema registry from Maven Central, for the
                     schema-registry tests
"""
