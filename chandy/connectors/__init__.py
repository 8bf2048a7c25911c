"""Sources and sinks. Sources keep their read positions in checkpointed state."""

from chandy.connectors.collection import CollectionSource
from chandy.connectors.number_sequence import NumberSequenceSource
from chandy.connectors.sinks import DiscardingSink, PrintSink

__all__ = ["CollectionSource", "DiscardingSink", "NumberSequenceSource", "PrintSink"]
