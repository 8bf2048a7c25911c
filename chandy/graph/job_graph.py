"""The JobGraph: operators chained into tasks (job vertices) joined by job edges.

Chaining (Flink's rule): a node joins its predecessor's task when it has exactly
one input, the edge is FORWARD, both run with the same parallelism and neither
forbids it. A chained operator costs one function call per batch instead of a
channel hop, so chaining is on by default.

Every operator gets a stable ``operator_id``: a hash of its ``uid`` if the user
set one, else of its position in the graph. Checkpoints and savepoints file
state under this id, which is why setting ``uid()`` keeps state restorable
across changes to the pipeline.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from chandy.errors import ConfigurationError, InvalidProgramError
from chandy.graph.stream_graph import ChainingStrategy, StreamEdge, StreamGraph, StreamNode
from chandy.state.key_groups import UPPER_BOUND_MAX_PARALLELISM, compute_default_max_parallelism
from chandy.task.arrow_partitioners import (
    ArrowForwardPartitioner,
    ArrowKeyGroupPartitioner,
    ArrowRebalancePartitioner,
)
from chandy.task.deployment import OperatorSpec
from chandy.task.partitioners import (
    ForwardPartitioner,
    KeyGroupStreamPartitioner,
    RebalancePartitioner,
    StreamPartitioner,
)


class DistributionPattern(enum.Enum):
    #: Producer i -> consumer i at equal parallelism, else contiguous ranges (pointwise_consumers).
    POINTWISE = "POINTWISE"
    ALL_TO_ALL = "ALL_TO_ALL"


@dataclass(eq=False)
class JobEdge:
    index: int
    source_vertex_id: int
    target_vertex_id: int
    #: The operator inside the source chain whose output feeds this edge.
    source_node_id: int
    partitioner: StreamPartitioner
    pattern: DistributionPattern
    #: Which input of the target's head operator the edge feeds: 0 (its only input), or
    #: 1 / 2 for a two-input operator (see ``StreamEdge.type_number``).
    type_number: int = 0


@dataclass(eq=False)
class JobVertex:
    id: int
    name: str
    parallelism: int
    max_parallelism: int
    operators: list[OperatorSpec]
    #: Operator ids (stable across runs), head first, parallel to ``operators``.
    operator_ids: list[str]
    is_source: bool
    inputs: list[JobEdge] = field(default_factory=list)
    outputs: list[JobEdge] = field(default_factory=list)
    #: The ``uid()`` the user set on each operator (``None`` where unset), parallel to
    #: ``operators``: written into checkpoints so that errors and ``chandy checkpoint
    #: inspect`` can name an operator by what the user wrote rather than by its hash.
    operator_uids: list[str | None] = field(default_factory=list)


@dataclass(eq=False)
class JobGraph:
    job_id: str
    job_name: str
    vertices: list[JobVertex]  # topological order
    edges: list[JobEdge]
    config: Mapping[str, Any]

    def vertex(self, vertex_id: int) -> JobVertex:
        for v in self.vertices:
            if v.id == vertex_id:
                return v
        raise KeyError(vertex_id)

    @property
    def max_parallelism_of_any_vertex(self) -> int:
        return max(v.parallelism for v in self.vertices)


def _operator_ids(order: list[StreamNode]) -> dict[int, str]:
    ids: dict[int, str] = {}
    seen_uids: dict[str, StreamNode] = {}
    for position, node in enumerate(order):
        if node.uid is not None:
            if node.uid in seen_uids:
                raise InvalidProgramError(
                    f"uid '{node.uid}' is set on both '{seen_uids[node.uid].name}' and "
                    f"'{node.name}'; every operator needs its own uid"
                )
            seen_uids[node.uid] = node
            material = f"uid:{node.uid}"
        else:
            inputs = ",".join(ids[e.source.id] for e in node.in_edges)
            material = f"pos:{position}:{inputs}"
        ids[node.id] = hashlib.sha256(material.encode()).hexdigest()[:32]
    return ids


def create_job_graph(
    stream_graph: StreamGraph,
    *,
    job_name: str,
    default_parallelism: int,
    default_max_parallelism: int,
    chaining_enabled: bool,
    config: Mapping[str, Any],
    job_id: str | None = None,
) -> JobGraph:
    """Resolve parallelisms and partitioners, chain operators, and build the JobGraph."""
    order = stream_graph.topological_order()
    if not order:
        raise InvalidProgramError(
            "no operators defined in the streaming topology; add a source and a sink "
            "(e.g. env.from_collection([...]).print()) before calling execute()"
        )
    if not any(node.is_sink for node in order):
        raise InvalidProgramError(
            "the pipeline has no sink, so it would compute nothing visible; end it with "
            "print(), add_sink(...), sink_to(...) or use execute_and_collect()"
        )
    for node in order:
        if node.parallelism is None:
            node.parallelism = default_parallelism
        _check_inputs(node)
    timestamped = stream_graph.timestamped_nodes()
    edges = {
        id(e): _resolve_partitioner(e).with_timestamps(n.id in timestamped)
        for n in order
        for e in n.out_edges
    }

    def chainable(edge: StreamEdge) -> bool:
        return (
            chaining_enabled
            and len(edge.target.in_edges) == 1
            and isinstance(edges[id(edge)], ForwardPartitioner)
            and edge.source.parallelism == edge.target.parallelism
            and edge.target.chaining is ChainingStrategy.ALWAYS
            and edge.source.chaining is not ChainingStrategy.NEVER
        )

    operator_ids = _operator_ids(order)
    head_of: dict[int, StreamNode] = {}
    chains: dict[int, list[StreamNode]] = {}
    for node in order:  # a node's input comes first, so its head is known already
        if len(node.in_edges) == 1 and chainable(node.in_edges[0]):
            head = head_of[node.in_edges[0].source.id]
        else:
            head = node
            chains[node.id] = []
        head_of[node.id] = head
        chains[head.id].append(node)

    vertices: dict[int, JobVertex] = {}
    for vertex_id, (head_id, members) in enumerate(chains.items(), start=1):
        head = members[0]
        assert head.parallelism is not None
        max_p = head.max_parallelism or (
            default_max_parallelism
            if default_max_parallelism > 0
            else compute_default_max_parallelism(head.parallelism)
        )
        if not head.parallelism <= max_p <= UPPER_BOUND_MAX_PARALLELISM:
            raise InvalidProgramError(
                f"operator '{head.name}' has parallelism {head.parallelism} but max parallelism "
                f"{max_p}; the max parallelism (number of key groups) must be at least the "
                f"parallelism and at most {UPPER_BOUND_MAX_PARALLELISM}: raise it with "
                "env.set_max_parallelism(...) or lower the parallelism"
            )
        vertices[head_id] = JobVertex(
            id=vertex_id,
            name=" -> ".join(m.name for m in members),
            parallelism=head.parallelism,
            max_parallelism=max_p,
            operators=[],
            operator_ids=[operator_ids[m.id] for m in members],
            is_source=head.is_source,
            operator_uids=[m.uid for m in members],
        )

    job_edges: list[JobEdge] = []
    network_outputs: dict[int, list[int]] = {n.id: [] for n in order}
    side_network: dict[int, dict[str, list[int]]] = {n.id: {} for n in order}
    vertex_output_count: dict[int, int] = {v.id: 0 for v in vertices.values()}
    for node in order:
        for edge in node.out_edges:
            if head_of[edge.target.id] is head_of[node.id]:
                continue
            source_vertex = vertices[head_of[node.id].id]
            target_vertex = vertices[edge.target.id]
            partitioner = edges[id(edge)]
            if isinstance(partitioner, (KeyGroupStreamPartitioner, ArrowKeyGroupPartitioner)):
                partitioner = partitioner.for_target(
                    target_vertex.max_parallelism, ship_keys=edge.target.keyed
                )
            pattern = (
                DistributionPattern.POINTWISE if partitioner.is_pointwise else DistributionPattern.ALL_TO_ALL
            )
            job_edge = JobEdge(
                len(job_edges),
                source_vertex.id,
                target_vertex.id,
                node.id,
                partitioner,
                pattern,
                edge.type_number,
            )
            job_edges.append(job_edge)
            source_vertex.outputs.append(job_edge)
            target_vertex.inputs.append(job_edge)
            if edge.side_output_tag is None:
                network_outputs[node.id].append(vertex_output_count[source_vertex.id])
            else:
                side_network[node.id].setdefault(edge.side_output_tag, []).append(
                    vertex_output_count[source_vertex.id]
                )
            vertex_output_count[source_vertex.id] += 1

    for head_id, members in chains.items():
        vertex = vertices[head_id]
        for member in members:
            chained = tuple(
                e.target.id
                for e in member.out_edges
                if head_of[e.target.id] is head_of[member.id] and e.side_output_tag is None
            )
            side_tags = sorted({e.side_output_tag for e in member.out_edges if e.side_output_tag is not None})
            side_outputs = tuple(
                (
                    tag,
                    tuple(
                        e.target.id
                        for e in member.out_edges
                        if e.side_output_tag == tag and head_of[e.target.id] is head_of[member.id]
                    ),
                    tuple(side_network[member.id].get(tag, ())),
                )
                for tag in side_tags
            )
            vertex.operators.append(
                OperatorSpec(
                    node_id=member.id,
                    name=member.name,
                    operator_id=operator_ids[member.id],
                    factory=member.operator_factory,
                    keyed=member.keyed,
                    chained_outputs=chained,
                    network_outputs=tuple(network_outputs[member.id]),
                    side_outputs=side_outputs,
                    uid=member.uid,
                )
            )

    return JobGraph(
        job_id=validate_job_id(job_id) if job_id is not None else uuid.uuid4().hex,
        job_name=job_name,
        vertices=list(vertices.values()),
        edges=job_edges,
        config=dict(config),
    )


def validate_job_id(job_id: str) -> str:
    """A fixed job id, checked as Flink's ``JobID.fromHexString`` checks it (32 hex digits,
    16 bytes), in lower case as Flink prints it.

    Checked before anything runs: the id names the job's checkpoint directory, and a
    resubmission finds its checkpoints only under exactly the same id.
    """
    value = job_id.strip().lower()
    if len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise ConfigurationError(
            f"$internal.pipeline.job-id (chandy.job-id) must be 32 hexadecimal digits, like Flink's "
            f"JobID (e.g. {uuid.uuid4().hex}), got {job_id!r}. Generate one once "
            "(python -c 'import uuid; print(uuid.uuid4().hex)') and submit the job with it every time."
        )
    return value


def _check_inputs(node: StreamNode) -> None:
    """A node's in-edges either all feed its one input (type 0) or feed inputs 1 and 2 of a
    two-input operator, each at least once: anything else is a bug in a builder, named here
    rather than found as a record reaching the wrong input."""
    types = {e.type_number for e in node.in_edges}
    if types and types not in ({0}, {1, 2}):
        raise InvalidProgramError(
            f"operator '{node.name}' has in-edges for inputs {sorted(types)}: a one-input operator "
            "takes input 0 only, a two-input operator (connect) inputs 1 and 2, each at least once"
        )


def _resolve_partitioner(edge: StreamEdge) -> StreamPartitioner:
    partitioner = edge.partitioner
    same = edge.source.parallelism == edge.target.parallelism
    columnar = edge.source.columnar  # the edge carries Arrow record batches (the batch path)
    if partitioner is None:
        if columnar:
            return ArrowForwardPartitioner() if same else ArrowRebalancePartitioner()
        return ForwardPartitioner() if same else RebalancePartitioner()
    if partitioner.columnar != columnar:
        _mismatched_partitioner(edge, partitioner)
    if isinstance(partitioner, ForwardPartitioner) and not same:
        raise InvalidProgramError(
            f"forward partitioning does not allow a change of parallelism: '{edge.source.name}' "
            f"runs with {edge.source.parallelism} and '{edge.target.name}' with "
            f"{edge.target.parallelism}. Use rebalance() (or another partitioning), or give "
            "both the same parallelism"
        )
    return partitioner


def _mismatched_partitioner(edge: StreamEdge, partitioner: StreamPartitioner) -> None:
    """A record partitioner on an edge of Arrow batches, or a batch partitioner on an edge of
    records: the partitioner would get items it cannot route. Named before anything runs."""
    if edge.source.columnar:
        raise InvalidProgramError(
            f"'{edge.source.name}' emits Arrow record batches, but its edge to '{edge.target.name}' has "
            f"the record partitioner {partitioner.name} ({type(partitioner).__name__}), which routes "
            "records: partition the BatchStream with its own key_by / rebalance / shuffle / ..., or "
            "convert it with to_records() first"
        )
    raise InvalidProgramError(
        f"'{edge.source.name}' emits records, but its edge to '{edge.target.name}' has the batch "
        f"partitioner {partitioner.name} ({type(partitioner).__name__}), which routes Arrow record "
        "batches: convert the stream with to_batches() first, or partition it as a DataStream"
    )
