"""A failure in the JSON shape Flink's REST client reads (``SerializedThrowable``).

Flink's REST API reports a failed asynchronous operation (a savepoint, a stop) as
``{"failure-cause": {"class", "stack-trace", "serialized-throwable"}}``, and
the Flink 2.3 CLI deserializes the last field with Java serialization: a body
without it is a JSON error to the CLI, which then never shows why the savepoint
failed. So chandy writes that field too. The bytes are Java's serialization of an
``org.apache.flink.util.SerializedThrowable`` made once from a
``java.lang.Exception("@@MESSAGE@@")`` with an empty stack trace (by Flink 2.3's
own classes); the three strings that carry the failure (message, class name,
stringified stack trace) and the wrapped exception's message are replaced. Java
serialization writes a string as a tag, a two-byte length and modified UTF-8;
replacing a string by another keeps every object handle in place.
"""

from __future__ import annotations

import base64
import struct
import traceback
from typing import Any

_TEMPLATE = base64.b64decode(
    "rO0ABXNyAClvcmcuYXBhY2hlLmZsaW5rLnV0aWwuU2VyaWFsaXplZFRocm93YWJsZWUWnfUfpxPzAgADTAAZZnVsbFN0cmlu"
    "Z2lmaWVkU3RhY2tUcmFjZXQAEkxqYXZhL2xhbmcvU3RyaW5nO0wAFm9yaWdpbmFsRXJyb3JDbGFzc05hbWVxAH4AAVsAE3Nl"
    "cmlhbGl6ZWRFeGNlcHRpb250AAJbQnhyABNqYXZhLmxhbmcuRXhjZXB0aW9u0P0fPho7HMQCAAB4cgATamF2YS5sYW5nLlRo"
    "cm93YWJsZdXGNSc5d7jLAwAETAAFY2F1c2V0ABVMamF2YS9sYW5nL1Rocm93YWJsZTtMAA1kZXRhaWxNZXNzYWdlcQB+AAFb"
    "AApzdGFja1RyYWNldAAeW0xqYXZhL2xhbmcvU3RhY2tUcmFjZUVsZW1lbnQ7TAAUc3VwcHJlc3NlZEV4Y2VwdGlvbnN0ABBM"
    "amF2YS91dGlsL0xpc3Q7eHBwdAAgamF2YS5sYW5nLkV4Y2VwdGlvbjogQEBNRVNTQUdFQEB1cgAeW0xqYXZhLmxhbmcuU3Rh"
    "Y2tUcmFjZUVsZW1lbnQ7AkYqPDz9IjkCAAB4cAAAAABzcgAfamF2YS51dGlsLkNvbGxlY3Rpb25zJEVtcHR5TGlzdHq4F7Q8"
    "p57eAgAAeHB4dAAhamF2YS5sYW5nLkV4Y2VwdGlvbjogQEBNRVNTQUdFQEAKdAATamF2YS5sYW5nLkV4Y2VwdGlvbnVyAAJb"
    "QqzzF/gGCFTgAgAAeHAAAAFerO0ABXNyABNqYXZhLmxhbmcuRXhjZXB0aW9u0P0fPho7HMQCAAB4cgATamF2YS5sYW5nLlRo"
    "cm93YWJsZdXGNSc5d7jLAwAETAAFY2F1c2V0ABVMamF2YS9sYW5nL1Rocm93YWJsZTtMAA1kZXRhaWxNZXNzYWdldAASTGph"
    "dmEvbGFuZy9TdHJpbmc7WwAKc3RhY2tUcmFjZXQAHltMamF2YS9sYW5nL1N0YWNrVHJhY2VFbGVtZW50O0wAFHN1cHByZXNz"
    "ZWRFeGNlcHRpb25zdAAQTGphdmEvdXRpbC9MaXN0O3hwcQB+AAZ0AAtAQE1FU1NBR0VAQHVyAB5bTGphdmEubGFuZy5TdGFj"
    "a1RyYWNlRWxlbWVudDsCRio8PP0iOQIAAHhwAAAAAHNyAB9qYXZhLnV0aWwuQ29sbGVjdGlvbnMkRW1wdHlMaXN0ergXtDyn"
    "nt4CAAB4cHg="
)

_PLACEHOLDER = "@@MESSAGE@@"
_TC_STRING = b"\x74"
_MAX_UTF = 65535
_STREAM_MAGIC = b"\xac\xed\x00\x05"


def _modified_utf8(text: str) -> bytes:
    """Java's ``writeUTF`` encoding: NUL as two bytes, characters beyond the BMP as surrogate pairs."""
    data = text.encode("utf-16-le", "surrogatepass")
    out = bytearray()
    for (unit,) in struct.iter_unpack("<H", data):
        if 0 < unit < 0x80:
            out.append(unit)
        elif unit < 0x800:
            out += bytes((0xC0 | unit >> 6, 0x80 | unit & 0x3F))
        else:
            out += bytes((0xE0 | unit >> 12, 0x80 | unit >> 6 & 0x3F, 0x80 | unit & 0x3F))
    return bytes(out)


def _java_string(text: str) -> bytes:
    encoded = _modified_utf8(text)
    while len(encoded) > _MAX_UTF:  # writeUTF's limit: keep the beginning of a long trace
        text = text[: len(text) * 9 // 10]
        encoded = _modified_utf8(text)
    return _TC_STRING + struct.pack(">H", len(encoded)) + encoded


def _replace_string(data: bytes, old: str, new: str) -> bytes:
    template = _java_string(old)
    assert template in data, old
    return data.replace(template, _java_string(new), 1)


def _serialized(class_name: str, message: str, stack_trace: str) -> bytes:
    inner_start = _TEMPLATE.index(_STREAM_MAGIC, 1)
    (inner_length,) = struct.unpack(">I", _TEMPLATE[inner_start - 4 : inner_start])
    inner = _replace_string(_TEMPLATE[inner_start : inner_start + inner_length], _PLACEHOLDER, message)
    outer = (
        _TEMPLATE[: inner_start - 4]
        + struct.pack(">I", len(inner))
        + inner
        + _TEMPLATE[inner_start + inner_length :]
    )
    outer = _replace_string(outer, f"java.lang.Exception: {_PLACEHOLDER}\n", stack_trace)
    outer = _replace_string(outer, "java.lang.Exception", class_name)
    return _replace_string(outer, f"java.lang.Exception: {_PLACEHOLDER}", message)


def serialized_throwable(error: BaseException) -> dict[str, Any]:
    """Flink's ``SerializedThrowable`` JSON for ``error``: what Flink's CLI prints as the cause."""
    class_name = f"{type(error).__module__}.{type(error).__qualname__}"
    message = str(error)
    stack_trace = "".join(traceback.format_exception(error))
    return {
        "class": class_name,
        "message": message,
        "stack-trace": stack_trace,
        "serialized-throwable": base64.b64encode(_serialized(class_name, message, stack_trace)).decode(),
    }
