from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Statistics:
    """Counters of a model or a session since it was created."""

    executes: int = 0
    resize_events: int = 0
    hook_calls: int = 0
    resize_reuses: int = 0  # shape changes served from a state computed before for the same input shapes
    buffer_allocations: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    submits: int = 0
    readbacks: int = 0
    dispatches: int = 0
    dropped_events: int = 0  # resize events a full subscriber buffer could not take
    # a ragged model's paged KV cache (a model's statistics only): its blocks now, and its prefix
    # cache since load, in prompt tokens looked up and found
    kv_blocks: int = 0
    kv_blocks_used: int = 0  # held by sessions
    kv_blocks_cached: int = 0  # held by none, kept for the prompts they start
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


class Counters:
    """The mutable twin of Statistics that the runtime increments."""

    def __init__(self):
        for name in Statistics.__dataclass_fields__:
            setattr(self, name, 0)

    def freeze(self):
        return Statistics(**{k: getattr(self, k) for k in Statistics.__dataclass_fields__})


__all__ = ["Statistics", "Counters", "asdict"]
