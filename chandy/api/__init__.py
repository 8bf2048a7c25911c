"""The builders users write jobs with: the environment, streams and checkpoint config.

They sit on top of every other layer (they build graphs and start runtimes).
The contracts a user implements (functions, state descriptors, sources and
sinks) are in :mod:`chandy.core`. This package imports nothing eagerly.
"""
