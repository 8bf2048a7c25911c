"""What users import: the environment, streams, functions and state descriptors.

``chandy.api.functions`` and ``chandy.api.state`` are contracts (interfaces a user
implements or calls) and import nothing from the rest of chandy, so every layer
may use them. The builders (``environment``, ``datastream``) sit on top of
everything. This package therefore imports nothing eagerly.
"""
