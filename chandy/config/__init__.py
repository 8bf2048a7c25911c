"""Typed configuration by Flink's keys.

A :class:`Configuration` holds raw ``key -> value`` pairs as the user gave them
(from ``env.configure({...})``, a YAML file or code). A :class:`ConfigOption`
knows one key: its type, default, deprecated aliases and how to check a value.
Values are parsed when read, so a bad value is reported with its key, what was
given and what is allowed, at the latest when the job is built.
"""

from chandy.config.configuration import ConfigOption, Configuration, parse_duration_ms

__all__ = ["ConfigOption", "Configuration", "parse_duration_ms"]
