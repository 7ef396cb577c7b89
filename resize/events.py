from dataclasses import dataclass


@dataclass(frozen=True)
class InputResized:
    """An execute changed the live shape of one input."""

    input_index: int
    name: str
    old: tuple
    new: tuple
