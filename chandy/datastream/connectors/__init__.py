"""PyFlink's ``pyflink.datastream.connectors``: the source and sink contracts, and per-system
submodules (``file_system``, ``kafka``, ``number_seq``) as PyFlink names them."""

from chandy.connectors import DeliveryGuarantee
from chandy.core.connector import Sink, Source

__all__ = ["DeliveryGuarantee", "Sink", "Source"]
