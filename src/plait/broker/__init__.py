"""Resource Broker: one per data center; machine records, the free pool, events."""

from plait.broker.broker import (
    FREE,
    BrokerChange,
    ChangeKind,
    Interner,
    MachineRecord,
    Region,
    ResourceBroker,
    Subscriber,
)

__all__ = [
    "FREE",
    "BrokerChange",
    "ChangeKind",
    "Interner",
    "MachineRecord",
    "Region",
    "ResourceBroker",
    "Subscriber",
]
