"""The events' TypedDicts moved to the ground floor: engine.event_types (each type's fields) and
engine.emit (the Emit protocol, generated), where the monitor and the workloads below the record
name them too. This module only re-exports them for the importers not yet moved."""
# transitional: importers move to engine.event_types and engine.emit

from engine.emit import Emit as Emit
from engine.event_types import *  # noqa: F401,F403
