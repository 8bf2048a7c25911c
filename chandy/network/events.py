"""Events that travel in a channel between record batches, in order.

A channel carries one ordered stream of items: a record batch (a ``list``) or a
:class:`RuntimeEvent`. Because events never overtake records, an
:class:`EndOfPartition` marks exactly where a producer's output ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """Base of every in-band event."""


@dataclass(frozen=True, slots=True)
class EndOfPartition(RuntimeEvent):
    """The producer finished: nothing follows on this channel."""


END_OF_PARTITION = EndOfPartition()
