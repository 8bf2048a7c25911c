"""Which state each new subtask gets on restore (Flink's ``StateAssignmentOperation``).

Keyed state moves by key group: new subtask i gets, from every old subtask, the
byte ranges of the key groups in its new range. An incremental handle (a RocksDB
checkpoint's files) cannot be split: it goes whole to every new subtask whose
range it overlaps, and the restore clips the database to that subtask's range. Operator state is redistributed
by mode: split-distribute lists are dealt out in contiguous chunks whose sizes
differ by at most one, union lists go whole to every subtask, broadcast state
gets one copy per subtask. At an unchanged parallelism only the union lists are
dealt out again (Flink's ``RoundRobinOperatorStateRepartitioner`` too): every
other list stays with its subtask. A source's splits sit beside its union list
(the shared reader state); dealt out again, a subtask whose split had ended would
take another subtask's split and send its records behind the in-flight data of an
unaligned checkpoint that it sent itself, the final watermark of its old split
included, which makes every record of the moved split late downstream. Nothing is
read here: only byte ranges move, and each subtask reads its own.

Input channel state (the in-flight data of an unaligned checkpoint) goes to the
subtask with the same index, unchanged. It is *not* redistributed: its items are
tied to one input channel of one subtask (the channel's index in the subtask's
input gate, which follows the producers' subtask indexes), and a restore with
another parallelism, or with other producers upstream, has other channels and
other key groups per subtask. Flink splits such data by key group and maps old
channels onto new ones ("virtual channels"); chandy refuses instead, with an
error that names the two ways out: restore at the old parallelism and take a
savepoint (always aligned, so it holds no channel state) to rescale from, or
restore from a savepoint or an aligned checkpoint.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

from chandy.checkpoint.operator_state import OperatorState
from chandy.errors import InvalidCheckpointError
from chandy.state.handles import (
    InputChannelStateHandle,
    KeyedStateHandle,
    OperatorStateDistributionMode,
    OperatorStateHandle,
    OperatorStateMeta,
    Range,
    StreamStateHandle,
)
from chandy.state.key_groups import KeyGroupRange
from chandy.state.snapshot import OperatorSubtaskState, TaskStateSnapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VertexToRestore:
    vertex_id: int
    name: str
    parallelism: int
    max_parallelism: int
    operator_ids: tuple[str, ...]
    operator_names: tuple[str, ...]
    #: Parallel to ``operator_ids``: the user's ``uid()`` (``None`` where unset) and whether
    #: the operator runs on a keyed stream (empty: unknown, nothing is checked).
    operator_uids: tuple[str | None, ...] = ()
    operator_keyed: tuple[bool, ...] = ()
    #: Per input edge, in the order of the subtasks' input channels: an operator id of the
    #: producing vertex and that vertex's parallelism now. The layout of every subtask's
    #: input channels follows from them, so channel state (in-flight data of an unaligned
    #: checkpoint) is restored only when each matches the checkpoint. ``None``: unknown,
    #: channel state is then checked against the vertex's own parallelism only.
    inputs: tuple[tuple[str, int], ...] | None = None

    def describe(self, index: int) -> str:
        """Operator ``index`` of this vertex as the user knows it: name and uid."""
        uid = self.operator_uids[index] if index < len(self.operator_uids) else None
        named = f"uid '{uid}'" if uid is not None else "no uid"
        return f"operator '{self.operator_names[index]}' ({named})"


def repartition_operator_state(
    old: list[list[OperatorStateHandle]], new_parallelism: int
) -> list[list[OperatorStateHandle]]:
    """Operator state handles per new subtask, given the handles per old subtask."""
    old_parallelism = len(old)
    modes: dict[str, OperatorStateDistributionMode] = {}
    for handles in old:
        for handle in handles:
            for name, meta in handle.states.items():
                modes.setdefault(name, meta.mode)
    has_union = any(m is OperatorStateDistributionMode.UNION for m in modes.values())
    if old_parallelism == new_parallelism and not has_union:
        return [list(handles) for handles in old]

    # (delegate, range) per element, in old subtask order, per state name
    elements: dict[str, list[tuple[StreamStateHandle, Range]]] = defaultdict(list)
    per_old: dict[str, list[list[tuple[StreamStateHandle, Range]]]] = defaultdict(
        lambda: [[] for _ in range(old_parallelism)]
    )
    for index, handles in enumerate(old):
        for handle in handles:
            for name, meta in handle.states.items():
                for byte_range in meta.elements:
                    elements[name].append((handle.delegate, byte_range))
                    per_old[name][index].append((handle.delegate, byte_range))

    assigned: list[dict[str, list[tuple[StreamStateHandle, Range]]]] = [
        defaultdict(list) for _ in range(new_parallelism)
    ]
    for name, mode in modes.items():
        items = elements[name]
        if mode is not OperatorStateDistributionMode.UNION and old_parallelism == new_parallelism:
            # Only the union lists are dealt out again (Flink keeps the rest where it was): a
            # source's splits stay with the subtask that read them, behind the in-flight data
            # of an unaligned checkpoint that this subtask sent (its watermarks included).
            for i in range(new_parallelism):
                assigned[i][name].extend(per_old[name][i])
        elif mode is OperatorStateDistributionMode.SPLIT_DISTRIBUTE:
            base, extra = divmod(len(items), new_parallelism)
            start = 0
            for i in range(new_parallelism):
                size = base + (1 if i < extra else 0)
                assigned[i][name].extend(items[start : start + size])
                start += size
        elif mode is OperatorStateDistributionMode.UNION:
            for i in range(new_parallelism):
                assigned[i][name].extend(items)
        else:  # BROADCAST: every old subtask holds the whole state; one copy each
            for i in range(new_parallelism):
                assigned[i][name].extend(per_old[name][i % old_parallelism])

    result: list[list[OperatorStateHandle]] = []
    for i in range(new_parallelism):
        by_delegate: dict[int, tuple[StreamStateHandle, dict[str, list[Range]]]] = {}
        for name, items in assigned[i].items():
            for delegate, byte_range in items:
                entry = by_delegate.setdefault(id(delegate), (delegate, defaultdict(list)))
                entry[1][name].append(byte_range)
        handles = []
        for delegate, ranges_by_name in by_delegate.values():
            states = {
                name: OperatorStateMeta(modes[name], tuple(ranges)) for name, ranges in ranges_by_name.items()
            }
            handles.append(OperatorStateHandle(states, delegate))
        result.append(handles)
    return result


def assign_states(
    operator_states: dict[str, OperatorState],
    vertices: list[VertexToRestore],
    *,
    allow_non_restored_state: bool,
    source: str,
) -> dict[tuple[int, int], TaskStateSnapshot]:
    """Per ``(vertex_id, subtask_index)``, the state that subtask restores."""
    known = {op_id for v in vertices for op_id in v.operator_ids}
    unclaimed = [
        s
        for op_id, s in operator_states.items()
        if op_id not in known and s.subtask_states and s.state_size > 0
    ]
    if unclaimed and not allow_non_restored_state:
        raise InvalidCheckpointError(_unclaimed_message(unclaimed, source))
    for skipped in unclaimed:
        in_flight = sum(s.channel_state_size for s in skipped.subtask_states.values())
        if in_flight:
            log.warning(
                "%s: skipping the state of %s (ignore-unclaimed-state), including %d bytes of "
                "in-flight records an unaligned checkpoint persisted: those records are not replayed.",
                source,
                skipped.describe(),
                in_flight,
            )
        else:
            log.info("%s: skipping the state of %s (ignore-unclaimed-state).", source, skipped.describe())
    result: dict[tuple[int, int], TaskStateSnapshot] = {}
    for vertex in vertices:
        per_subtask: list[dict[str, OperatorSubtaskState]] = [{} for _ in range(vertex.parallelism)]
        for operator_id in vertex.operator_ids:
            state = operator_states.get(operator_id)
            if state is None:
                continue  # new in this job: its subtasks start without state
            keyed_handles = [h for s in state.subtask_states.values() for h in s.managed_keyed_state]
            position = vertex.operator_ids.index(operator_id)
            if keyed_handles and state.max_parallelism != vertex.max_parallelism:
                raise InvalidCheckpointError(
                    f"{source}: {vertex.describe(position)} was checkpointed with max parallelism "
                    f"{state.max_parallelism} and now has {vertex.max_parallelism}. Keyed state "
                    "is split into max-parallelism key groups, so it cannot change: set "
                    f"set_max_parallelism({state.max_parallelism}) on it (or "
                    f"pipeline.max-parallelism: {state.max_parallelism} for the whole job)."
                )
            if (
                keyed_handles
                and position < len(vertex.operator_keyed)
                and not vertex.operator_keyed[position]
            ):
                raise InvalidCheckpointError(
                    f"{source}: {vertex.describe(position)} has keyed state in the checkpoint but "
                    "no longer runs on a keyed stream, so its state cannot be restored. Put it "
                    "after key_by(...) again, or give it a new uid() and set "
                    "execution.state-recovery.ignore-unclaimed-state: true to start it without state."
                )
            old_operator = [
                list(state.subtask_states[i].managed_operator_state) if i in state.subtask_states else []
                for i in range(state.parallelism)
            ]
            new_operator = repartition_operator_state(old_operator, vertex.parallelism)
            channels = _channel_state(state, operator_states, vertex, position, source)
            for i in range(vertex.parallelism):
                key_range = KeyGroupRange.of_operator(vertex.max_parallelism, vertex.parallelism, i)
                keyed: list[KeyedStateHandle] = []
                for handle in keyed_handles:
                    part = handle.intersection(key_range)
                    if part is not None:
                        keyed.append(part)
                # Every subtask of an operator the checkpoint holds gets an entry, an empty one
                # too: "was in the checkpoint, nothing for you" differs from "new operator" (a
                # restored source reads only the splits it is given; a new one plans its own).
                per_subtask[i][operator_id] = OperatorSubtaskState(
                    tuple(keyed), tuple(new_operator[i]), input_channel_state=channels[i]
                )
        for i in range(vertex.parallelism):
            result[(vertex.vertex_id, i)] = TaskStateSnapshot(per_subtask[i])
    return result


def _channel_state(
    state: OperatorState,
    operator_states: dict[str, OperatorState],
    vertex: VertexToRestore,
    position: int,
    source: str,
) -> list[tuple[InputChannelStateHandle, ...]]:
    """Per new subtask, the input channel state it restores: the same subtask's, when the
    channels are the same ones as when the checkpoint was taken (see the module docstring)."""
    held = {
        i: s.input_channel_state
        for i, s in state.subtask_states.items()
        if any(h.length for h in s.input_channel_state)  # empty slices hold nothing to replay
    }
    if not held:
        return [() for _ in range(vertex.parallelism)]
    changed: list[str] = []
    if position != 0:
        # the task replays channel state into its input gate, which feeds its first operator
        changed.append(
            f"it is no longer the first operator of its task (now chained after "
            f"'{vertex.operator_names[0]}'), and the in-flight data belongs to the task's inputs"
        )
    if state.parallelism != vertex.parallelism:
        changed.append(f"its parallelism changed from {state.parallelism} to {vertex.parallelism}")
    for upstream_id, parallelism in vertex.inputs or ():
        upstream = operator_states.get(upstream_id)
        # an upstream operator the checkpoint does not know (finished before it, or a new
        # uid) says nothing about the old channels: only a known parallelism is compared
        if upstream is not None and upstream.parallelism != parallelism:
            changed.append(
                f"its number of input channels changed: the parallelism of upstream "
                f"{upstream.describe()} changed from {upstream.parallelism} to {parallelism}"
            )
    if changed:
        raise InvalidCheckpointError(
            f"{source}: {vertex.describe(position)} cannot be restored because "
            f"{'; '.join(changed)}. The checkpoint is unaligned and holds in-flight data "
            f"(channel state of {len(held)} subtask(s)), which cannot be redistributed to other "
            f"channels. Restore it at parallelism {state.parallelism} first, with the job as it "
            "was (same upstream parallelism and chaining), and take a savepoint (savepoints are "
            "always aligned), then change the job and restore from that savepoint; or restore "
            "from a savepoint or an aligned checkpoint."
        )
    return [held.get(i, ()) for i in range(vertex.parallelism)]


def _unclaimed_message(unclaimed: list[OperatorState], source: str) -> str:
    """One error for every operator whose state has no place in the new job, with both fixes."""
    listed = "; ".join(state.describe() for state in unclaimed)
    uids = [state.uid for state in unclaimed if state.uid is not None]
    keep = (
        f"otherwise keep each operator's uid as it was (e.g. .uid('{uids[0]}')), so its state finds it again"
        if uids
        else "otherwise give the operators the uid() they had; an operator without a uid is "
        "matched by its position in the pipeline, which changed (set uid() on every stateful "
        "operator you mean to keep across changes)"
    )
    return (
        f"{source} holds state of {len(unclaimed)} operator(s) that the job no longer has: "
        f"{listed}. If you removed them (or changed their uid) on purpose, set "
        "execution.state-recovery.ignore-unclaimed-state: true (chandy run "
        "--allow-non-restored-state) to start without their state; "
        f"{keep}."
    )
