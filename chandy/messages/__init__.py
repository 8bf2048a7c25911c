"""Messages between tasks and the checkpoint coordinator, and the gateways that carry them.

They sit below both ``chandy.task`` and ``chandy.checkpoint``: the coordinator
never imports the task layer, it only sends and receives these dataclasses
through the gateway protocols. In one process a gateway is a direct call; on
Spark it is an RPC to the driver.
"""
