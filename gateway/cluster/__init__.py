"""Gateways that share the work: who owns which partition of the stream, and the
hop from the gateway a client reached to the one that owns its thread (issue #26).

* `owners`: the owner map, learned from the `gateways` topic, which each gateway of
  the group writes on every rebalance;
* `hop`: the signed header that carries an authenticated tenant from one gateway
  to another;
* `remote`: a stream served by the owner, through this gateway.
"""
