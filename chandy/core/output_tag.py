"""OutputTag: names a side output of an operator (PyFlink's ``OutputTag``)."""

from __future__ import annotations

from typing import Any


class OutputTag:
    """A side output, identified by its ``tag_id``.

    A process function emits to it by yielding ``(output_tag, value)``;
    ``stream.get_side_output(output_tag)`` is the stream of those values. The
    type information is accepted for PyFlink compatibility and only describes.
    """

    __slots__ = ("tag_id", "type_info")

    def __init__(self, tag_id: str, type_info: Any = None) -> None:
        if not isinstance(tag_id, str) or not tag_id:
            raise ValueError("OutputTag needs a non-empty string tag_id")
        self.tag_id = tag_id
        self.type_info = type_info

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.tag_id == self.tag_id

    def __hash__(self) -> int:
        return hash(("OutputTag", self.tag_id))

    def __repr__(self) -> str:
        return f"OutputTag({self.tag_id!r})"

    def __reduce__(self) -> tuple[type, tuple[str, Any]]:
        return OutputTag, (self.tag_id, self.type_info)
