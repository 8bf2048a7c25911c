"""ConfigOption and Configuration: the typed view over raw key/value pairs."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from chandy.errors import ConfigurationError

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)

_DURATION_UNITS_MS = {
    "ns": 1e-6,
    "nano": 1e-6,
    "nanos": 1e-6,
    "nanosecond": 1e-6,
    "nanoseconds": 1e-6,
    "us": 1e-3,
    "micro": 1e-3,
    "micros": 1e-3,
    "microsecond": 1e-3,
    "microseconds": 1e-3,
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_duration_ms(value: Any) -> int:
    """Parse a duration the way Flink does: ``500`` (ms), ``"500 ms"``, ``"10 min"``, ``"1s"``.

    A plain number means milliseconds. Raises :class:`ValueError` on anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return int(value)
    if isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match:
            number, unit = match.groups()
            factor = _DURATION_UNITS_MS.get(unit.lower() or "ms")
            if factor is not None:
                return int(float(number) * factor)
    raise ValueError(f"{value!r} is not a duration (use e.g. 500, '500 ms', '10 s', '10 min')")


_MEMORY_UNITS = {
    "": 1,
    "b": 1,
    "bytes": 1,
    "k": 1024,
    "kb": 1024,
    "kibibytes": 1024,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mebibytes": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gibibytes": 1 << 30,
}


def parse_memory_size(value: Any) -> int:
    """Parse a memory size as Flink does: ``1024`` (bytes), ``"20 kb"``, ``"1mb"``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value!r} is negative")
        return value
    if isinstance(value, str):
        match = re.match(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$", value)
        if match and match.group(2).lower() in _MEMORY_UNITS:
            return int(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]
    raise ValueError(f"{value!r} is not a memory size (use e.g. 1024, '20 kb', '1 mb')")


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{value!r} is not true or false")


def _parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ValueError(f"{value!r} is not an integer")


def _parse_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    number: float | None = None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            pass
    if number is None or not math.isfinite(number):
        raise ValueError(f"{value!r} is not a number")
    return number


def _parse_str(value: Any) -> str:
    if isinstance(value, (str, Path)):
        return str(value)
    raise ValueError(f"{value!r} is not a string")


@dataclass(frozen=True)
class ConfigOption(Generic[T]):
    """One configuration key: type, default, aliases and the check on its value.

    ``parse`` turns a raw value into ``T`` or raises :class:`ValueError`;
    ``check`` may further reject a parsed value with a :class:`ValueError` whose
    text says what is allowed. ``allowed`` is shown in every error message.
    """

    key: str
    default: T
    description: str
    parse: Callable[[Any], T]
    allowed: str
    deprecated_keys: tuple[str, ...] = ()
    check: Callable[[T], None] | None = field(default=None, compare=False)

    @overload
    @staticmethod
    def integer(
        key: str,
        default: int,
        description: str,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int]: ...

    @overload
    @staticmethod
    def integer(
        key: str,
        default: None,
        description: str,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int | None]: ...

    @staticmethod
    def integer(
        key: str,
        default: int | None,
        description: str,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int] | ConfigOption[int | None]:
        """An integer option, optionally bounded, so a bad value is refused with the key and the bounds."""

        def check(v: int | None) -> None:
            if v is None:
                return
            if minimum is not None and v < minimum:
                raise ValueError(f"{v} is below the minimum {minimum}")
            if maximum is not None and v > maximum:
                raise ValueError(f"{v} is above the maximum {maximum}")

        bounds = (f" >= {minimum}" if minimum is not None else "") + (
            f" and <= {maximum}" if maximum is not None else ""
        )
        return ConfigOption(
            key, default, description, _parse_int, f"an integer{bounds}", deprecated_keys, check
        )

    @overload
    @staticmethod
    def duration(
        key: str,
        default: int,
        description: str,
        *,
        minimum_ms: int = 0,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int]: ...

    @overload
    @staticmethod
    def duration(
        key: str,
        default: None,
        description: str,
        *,
        minimum_ms: int = 0,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int | None]: ...

    @staticmethod
    def duration(
        key: str,
        default: int | None,
        description: str,
        *,
        minimum_ms: int = 0,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[int] | ConfigOption[int | None]:
        """A duration option in milliseconds that also accepts ``'500 ms'``, ``'10 s'`` or ``'10 min'``, as
        Flink's configuration does."""

        def check(v: int | None) -> None:
            if v is not None and v < minimum_ms:
                raise ValueError(f"{v} ms is below the minimum {minimum_ms} ms")

        return ConfigOption(
            key,
            default,
            description,
            parse_duration_ms,
            "a duration such as 500, '500 ms', '10 s' or '10 min'"
            + (f", at least {minimum_ms} ms" if minimum_ms else ""),
            deprecated_keys,
            check,
        )

    @staticmethod
    def memory_size(
        key: str, default: int, description: str, *, maximum: int, deprecated_keys: tuple[str, ...] = ()
    ) -> ConfigOption[int]:
        """A size in bytes that also accepts ``'20 kb'`` or ``'64 mb'``, as Flink's configuration does."""

        def check(v: int) -> None:
            if v > maximum:
                raise ValueError(f"{v} bytes is above the maximum {maximum} bytes")

        return ConfigOption(
            key,
            default,
            description,
            parse_memory_size,
            f"a memory size such as 20 kb, at most {maximum} bytes",
            deprecated_keys,
            check,
        )

    @staticmethod
    def number(
        key: str,
        default: float,
        description: str,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
    ) -> ConfigOption[float]:
        """A floating-point value within ``[minimum, maximum]`` (``above``: strictly greater)."""

        def check(v: float) -> None:
            if minimum is not None and v < minimum:
                raise ValueError(f"{v} is below the minimum {minimum}")
            if maximum is not None and v > maximum:
                raise ValueError(f"{v} is above the maximum {maximum}")
            if above is not None and v <= above:
                raise ValueError(f"{v} is not above {above}")

        bounds = [f">= {minimum}" if minimum is not None else "", f"> {above}" if above is not None else ""]
        bounds.append(f"<= {maximum}" if maximum is not None else "")
        shown = " and ".join(b for b in bounds if b)
        return ConfigOption(
            key, default, description, _parse_float, "a number" + (f" {shown}" if shown else ""), (), check
        )

    @staticmethod
    def boolean(
        key: str, default: bool, description: str, deprecated_keys: tuple[str, ...] = ()
    ) -> ConfigOption[bool]:
        """A ``true``/``false`` option (also accepts the strings a YAML file or ``-D`` gives)."""
        return ConfigOption(key, default, description, _parse_bool, "true or false", deprecated_keys)

    @overload
    @staticmethod
    def string(
        key: str,
        default: str,
        description: str,
        *,
        choices: Iterable[str] | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[str]: ...

    @overload
    @staticmethod
    def string(
        key: str,
        default: None,
        description: str,
        *,
        choices: Iterable[str] | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[str | None]: ...

    @staticmethod
    def string(
        key: str,
        default: str | None,
        description: str,
        *,
        choices: Iterable[str] | None = None,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[str] | ConfigOption[str | None]:
        """A string option, optionally restricted to ``choices``."""
        if choices is None:
            return ConfigOption(key, default, description, _parse_str, "a string", deprecated_keys)
        names = tuple(choices)
        lowered = {c.lower(): c for c in names}

        def parse(value: Any) -> str:
            text = _parse_str(value).strip().lower()
            if text not in lowered:
                raise ValueError(f"{value!r} is not one of {', '.join(names)}")
            return lowered[text]

        return ConfigOption(key, default, description, parse, "one of " + ", ".join(names), deprecated_keys)

    @staticmethod
    def enumeration(
        key: str,
        enum_type: type[E],
        default: E,
        description: str,
        deprecated_keys: tuple[str, ...] = (),
    ) -> ConfigOption[E]:
        """An option whose value is one member of ``enum_type``, given by name."""
        names = [m.name for m in enum_type]

        def parse(value: Any) -> E:
            if isinstance(value, enum_type):
                return value
            if isinstance(value, str):
                text = value.strip().upper().replace("-", "_")
                if text in enum_type.__members__:
                    return enum_type[text]
            raise ValueError(f"{value!r} is not one of {', '.join(names)}")

        return ConfigOption(key, default, description, parse, "one of " + ", ".join(names), deprecated_keys)


class Configuration:
    """Raw key/value pairs plus typed access through :class:`ConfigOption`.

    Keys are Flink's (``execution.checkpointing.interval``); deprecated 1.x aliases
    are read when the new key is absent. Unknown keys are kept (connectors and
    later features read their own), so a typo is caught by :meth:`unknown_keys`,
    which the environment checks against every known option at ``execute()``.
    """

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = {}
        if values:
            self.update(values)

    def update(self, values: Mapping[str, Any] | Configuration) -> None:
        """Set many keys at once (a dict or another Configuration)."""
        items = values.to_dict() if isinstance(values, Configuration) else values
        for key, value in items.items():
            if not isinstance(key, str):
                raise ConfigurationError(f"configuration keys are strings, got {key!r}")
            self._values[key] = value

    def set(self, option: ConfigOption[T] | str, value: Any) -> Configuration:
        """Set one key (by option or by key string); returns self for chaining."""
        key = option if isinstance(option, str) else option.key
        self._values[key] = value
        return self

    def set_string(self, key: str, value: str) -> Configuration:
        """PyFlink's name for :meth:`set` with a string value."""
        return self.set(key, value)

    def get_string(self, key: str, default_value: str | None = None) -> str | None:
        """PyFlink's raw read of a key as a string."""
        value = self._values.get(key)
        return default_value if value is None else str(value)

    def contains(self, option: ConfigOption[Any] | str) -> bool:
        """Whether the key (or an option, under any of its spellings) is set."""
        if isinstance(option, str):
            return option in self._values
        return self._raw_key(option) is not None

    def _raw_key(self, option: ConfigOption[Any]) -> str | None:
        if option.key in self._values:
            return option.key
        for alias in option.deprecated_keys:
            if alias in self._values:
                return alias
        return None

    def get(self, option: ConfigOption[T]) -> T:
        """The parsed value of ``option``, or its default; a bad value raises
        :class:`ConfigurationError` naming the key, the value and what is allowed."""
        key = self._raw_key(option)
        if key is None:
            return option.default
        raw = self._values[key]
        if raw is None:
            return option.default
        try:
            value = option.parse(raw)
            if option.check is not None:
                option.check(value)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"invalid value for '{key}': {exc}. Allowed: {option.allowed}."
            ) from None
        return value

    def unknown_keys(
        self, known: Iterable[ConfigOption[Any]], prefixes_owned_elsewhere: Iterable[str] = ()
    ) -> list[str]:
        """Keys that no known option (nor a prefix owned by a plugin) claims."""
        names = set()
        for option in known:
            names.add(option.key)
            names.update(option.deprecated_keys)
        prefixes = tuple(prefixes_owned_elsewhere)
        return sorted(k for k in self._values if k not in names and not k.startswith(prefixes))

    def to_dict(self) -> dict[str, Any]:
        """A copy of the raw pairs."""
        return dict(self._values)

    def copy(self) -> Configuration:
        """An independent copy: changing it leaves this configuration as it is."""
        return Configuration(self._values)

    @classmethod
    def from_file(cls, path: str | Path) -> Configuration:
        """Read a Flink-style ``config.yaml`` (nested or flat keys), checked as it is read:
        an unknown key or a bad value is an error naming the file and the line, not a
        surprise at ``execute()`` (or never, when the program overrides the key)."""
        import yaml

        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read configuration file '{p}': {exc.strerror}. Check the path."
            ) from None
        try:
            data = yaml.safe_load(text) or {}
            lines = _key_lines(yaml.compose(text))
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"configuration file '{p}' is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigurationError(f"configuration file '{p}' must hold a mapping of keys to values")
        config = cls(_flatten(data))
        from chandy.config.options import check_configuration  # options build on this module

        check_configuration(config, lambda key: f"configuration file '{p}', line {lines.get(key, '?')}: ")
        return config

    def __repr__(self) -> str:
        return f"Configuration({self._values!r})"


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, full + "."))
        else:
            out[full] = value
    return out


def _key_lines(node: Any, prefix: str = "") -> dict[str, int]:
    """The line (1-based) of every flattened key of a composed YAML mapping."""
    import yaml

    lines: dict[str, int] = {}
    if not isinstance(node, yaml.MappingNode):
        return lines
    for key_node, value_node in node.value:
        full = f"{prefix}{key_node.value}"
        if isinstance(value_node, yaml.MappingNode):
            lines.update(_key_lines(value_node, full + "."))
        else:
            lines[full] = key_node.start_mark.line + 1
    return lines
