from dataclasses import dataclass


@dataclass(frozen=True)
class InputResized:
    """An execute changed the live shape of one input."""

    session: int  # the session's id (0 for the model's default session)
    input_index: int
    name: str
    old: tuple
    new: tuple
