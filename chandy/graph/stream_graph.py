"""The StreamGraph: one node per operator the user wrote, one edge per connection."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chandy.task.operators.base import StreamOperator
from chandy.task.partitioners import StreamPartitioner


class ChainingStrategy(enum.Enum):
    """Flink's: ALWAYS chain with the predecessor where possible, start a new chain (HEAD), or NEVER."""

    ALWAYS = "ALWAYS"
    HEAD = "HEAD"
    NEVER = "NEVER"


@dataclass(eq=False)
class StreamNode:
    id: int
    name: str
    #: Zero-argument picklable callable building the operator.
    operator_factory: Callable[[], StreamOperator]
    is_source: bool = False
    is_sink: bool = False
    #: Records arrive as (key_group, key, value): the node consumes a keyed stream.
    keyed: bool = False
    #: The node gives its output event timestamps of its own (a source with a watermark
    #: strategy, ``assign_timestamps_and_watermarks``, a window); any node whose input has
    #: timestamps passes them on.
    assigns_timestamps: bool = False
    #: The node's output is Arrow record batches (a ``BatchStream``), not lists of records:
    #: the edges out of it use the columnar partitioners and record writer.
    columnar: bool = False
    #: The column of the node's record batches that holds event time (a batch source or
    #: ``BatchStream.assign_timestamps_and_watermarks`` with ``with_timestamp_column``, and
    #: every batch operator that keeps its input's rows, such as ``map_batches``), or None.
    timestamp_column: str | None = None
    #: The event-time column of each side output whose rows are the input's (a batch
    #: window's late rows), by tag id: a window can follow ``get_side_output`` directly.
    side_output_timestamp_columns: dict[str, str] = field(default_factory=dict)
    #: The type the user declared for the node's records (PyFlink's ``output_type`` /
    #: ``type_info``); it only decides how ``print()`` writes them, as Flink's Java would.
    output_type: Any = None
    #: The declared type of each side output (its ``OutputTag``'s ``type_info``), by tag id.
    side_output_types: dict[str, Any] = field(default_factory=dict)
    parallelism: int | None = None
    max_parallelism: int | None = None
    uid: str | None = None
    chaining: ChainingStrategy = ChainingStrategy.ALWAYS
    in_edges: list[StreamEdge] = field(default_factory=list)
    out_edges: list[StreamEdge] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"StreamNode({self.id}, {self.name!r}, p={self.parallelism})"


@dataclass(eq=False)
class StreamEdge:
    source: StreamNode
    target: StreamNode
    #: ``None``: forward where the parallelisms match, rebalance where they differ.
    partitioner: StreamPartitioner | None
    #: The edge carries the source's side output with this tag id, not its main output.
    side_output_tag: str | None = None
    #: Which input of the target it feeds (Flink's ``typeNumber``): 0 for a one-input
    #: operator, 1 or 2 for the first or second input of a two-input operator (``connect``).
    type_number: int = 0

    def __repr__(self) -> str:
        side = f"[{self.side_output_tag}]" if self.side_output_tag else ""
        into = f"#{self.type_number}" if self.type_number else ""
        return f"{self.source.id}{side} -{self.partitioner or 'default'}-> {self.target.id}{into}"


class StreamGraph:
    """Nodes and edges as built by the DataStream API, before chaining."""

    def __init__(self) -> None:
        self.nodes: dict[int, StreamNode] = {}
        self._next_id = 1

    def add_node(
        self,
        name: str,
        operator_factory: Callable[[], StreamOperator],
        *,
        is_source: bool = False,
        is_sink: bool = False,
        keyed: bool = False,
        parallelism: int | None = None,
    ) -> StreamNode:
        node = StreamNode(
            self._next_id,
            name,
            operator_factory,
            is_source=is_source,
            is_sink=is_sink,
            keyed=keyed,
            parallelism=parallelism,
        )
        self.nodes[node.id] = node
        self._next_id += 1
        return node

    def add_edge(
        self,
        source: StreamNode,
        target: StreamNode,
        partitioner: StreamPartitioner | None,
        side_output_tag: str | None = None,
        type_number: int = 0,
    ) -> StreamEdge:
        edge = StreamEdge(source, target, partitioner, side_output_tag, type_number)
        source.out_edges.append(edge)
        target.in_edges.append(edge)
        return edge

    def topological_order(self) -> list[StreamNode]:
        """Nodes so that every node comes after all its inputs (ties by creation order)."""
        indegree = {n.id: len(n.in_edges) for n in self.nodes.values()}
        ready = sorted(n.id for n in self.nodes.values() if indegree[n.id] == 0)
        order: list[StreamNode] = []
        while ready:
            node = self.nodes[ready.pop(0)]
            order.append(node)
            for edge in node.out_edges:
                indegree[edge.target.id] -= 1
                if indegree[edge.target.id] == 0:
                    ready.append(edge.target.id)
                    ready.sort()
        return order

    def timestamped_nodes(self) -> set[int]:
        """Ids of the nodes whose output may carry event timestamps: those that assign them
        and everything downstream of one (the edges out of them carry a timestamp column)."""
        found: set[int] = set()
        for node in self.topological_order():
            if node.assigns_timestamps or any(e.source.id in found for e in node.in_edges):
                found.add(node.id)
        return found

    def clear(self) -> None:
        self.nodes.clear()
