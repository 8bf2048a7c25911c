"""StreamExecutionEnvironment: where a pipeline is defined and from where it is run."""

from __future__ import annotations

import json
import logging
import os
import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from chandy.api.checkpoint_config import CheckpointConfig
from chandy.api.datastream import DataStream
from chandy.api.execution_config import ExecutionConfig
from chandy.api.state_backend import StateBackend, state_backend_of
from chandy.checkpoint.coordinator import check_unaligned_settings
from chandy.config import Configuration
from chandy.config.options import (
    CheckpointingMode,
    CheckpointingOptions,
    CoreOptions,
    ExecutionOptions,
    ExternalizedCheckpointRetention,
    PipelineOptions,
    RestartStrategyOptions,
    RestOptions,
    StateRecoveryOptions,
    all_options,
    check_configuration,
)
from chandy.core.connector import Boundedness, Sink, Source
from chandy.core.watermark_strategy import WatermarkStrategy
from chandy.errors import ConfigurationError, InvalidProgramError, JobCancelledError
from chandy.graph.job_graph import JobGraph, create_job_graph
from chandy.graph.stream_graph import StreamGraph
from chandy.runtime import console
from chandy.runtime.collect import CollectIterator, CollectResultQueue
from chandy.runtime.executor import Executor
from chandy.runtime.job_client import JobClient
from chandy.runtime.job_master import JobMaster
from chandy.runtime.job_result import JobExecutionResult
from chandy.runtime.restart_strategy import ignored_restart_keys, restart_strategy_from
from chandy.runtime.status_line import show_status_line
from chandy.task.operators.source import SourceOperator, check_columnar_watermarks

if TYPE_CHECKING:
    from chandy.api.batch_stream import BatchStream
    from chandy.web.service import WebService

log = logging.getLogger(__name__)

_EXECUTORS = ("spark", "local")

#: The environment variable through which ``chandy run`` hands its settings to the job: a JSON
#: object of configuration keys, e.g. ``{"parallelism.default": 4}``.
CONFIG_ENV_VAR = "CHANDY_CONFIG"


def configuration_from_environment() -> Configuration:
    """The configuration ``chandy run`` passed in ``CHANDY_CONFIG`` (empty when it is unset).

    Read by every new environment as its base configuration, so a program that is run by
    ``chandy run -p 4 -s <savepoint>`` gets those settings without knowing about them, and
    what the program sets itself (``set_parallelism``, ``configure``) still wins.
    """
    raw = os.environ.get(CONFIG_ENV_VAR)
    if raw is None or not raw.strip():
        return Configuration()
    try:
        values = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(
            f"the environment variable {CONFIG_ENV_VAR} is not valid JSON ({exc}): it must hold a JSON "
            'object of configuration keys, e.g. {"parallelism.default": 4}; unset it, or pass the '
            "settings through `chandy run -D key=value`"
        ) from None
    if not isinstance(values, dict):
        raise ConfigurationError(
            f"the environment variable {CONFIG_ENV_VAR} must hold a JSON object of configuration keys, "
            f'e.g. {{"parallelism.default": 4}}, got a JSON {type(values).__name__}'
        )
    config = Configuration(values)
    # Checked now, not at execute(): the program may override a key, and its bad value with it.
    check_configuration(config, lambda key: f"{CONFIG_ENV_VAR}: ")
    return config


def _override_base_spellings(
    config: Configuration, base_keys: frozenset[str], given: Configuration | Mapping[str, Any]
) -> None:
    """Make a key the program sets win over another spelling of the same option (its new name
    or a deprecated alias) that came from ``CHANDY_CONFIG``: a lookup prefers the new name, so
    ``configure({"execution.savepoint.path": ...})`` would otherwise lose to ``chandy run -s``."""
    if not base_keys:
        return
    items = given.to_dict() if isinstance(given, Configuration) else dict(given)
    for option in all_options():
        spellings = (option.key, *option.deprecated_keys)
        chosen = next((k for k in spellings if k in items), None)
        if chosen is None:
            continue
        for key in spellings:
            if key in base_keys and key not in items:
                config.set(key, items[chosen])


class StreamExecutionEnvironment:
    """The context in which a streaming job is defined and executed.

    Build a pipeline from its sources, then call :meth:`execute` (or
    ``execute_and_collect()`` on a stream). Each ``execute`` runs what was
    defined since the previous one, so one environment can run several jobs.
    """

    def __init__(self, configuration: Configuration | Mapping[str, Any] | None = None) -> None:
        # What `chandy run` passed (-p, -s, -D ...) is the base; the program's own settings win.
        self._config = configuration_from_environment()
        self._base_keys = frozenset(self._config.to_dict())
        if configuration is not None:
            self.configure(configuration)
        self._stream_graph = StreamGraph()
        # Names of the unbounded sources and two-phase-committing sinks defined since the
        # last execute: without checkpointing such a job never commits its output.
        self._unbounded_sources: list[str] = []
        self._two_phase_sinks: list[str] = []
        #: Every sink of the graph being built: each is configured at submission.
        self._sinks: list[Sink] = []
        # The REST server (Flink's API, dashboard, /metrics) over this environment's jobs,
        # created with the first job; chandy.web.service says how long it lives.
        self._web: WebService | None = None

    @staticmethod
    def get_execution_environment(
        configuration: Configuration | Mapping[str, Any] | None = None, executor: str | None = None
    ) -> StreamExecutionEnvironment:
        """A new environment. Jobs run on Spark (the active session, or a local one) unless
        ``executor="local"``, which runs every subtask as a thread of this process."""
        env = StreamExecutionEnvironment(configuration)
        if executor is not None:
            env._config.set(ExecutionOptions.TARGET, executor)
            env._config.get(ExecutionOptions.TARGET)  # reject a bad name now
        return env

    # ------------------------------------------------------------------ settings

    def configure(self, configuration: Configuration | Mapping[str, Any]) -> StreamExecutionEnvironment:
        """Set options by Flink's keys, e.g. ``{"parallelism.default": 4}``."""
        if not isinstance(configuration, (Configuration, Mapping)):
            raise ConfigurationError(
                f"configure() takes a dict or a Configuration, got {type(configuration).__name__}"
            )
        self._config.update(configuration)
        _override_base_spellings(self._config, self._base_keys, configuration)
        return self

    def get_configuration(self) -> Configuration:
        """A copy of the environment's configuration."""
        return self._config.copy()

    def get_config(self) -> ExecutionConfig:
        """PyFlink's execution settings (the watermark interval); they write this
        environment's configuration."""
        return ExecutionConfig(self._config)

    def set_parallelism(self, parallelism: int) -> StreamExecutionEnvironment:
        """Default parallelism of operators that set none."""
        self._config.set(CoreOptions.DEFAULT_PARALLELISM, parallelism)
        self._config.get(CoreOptions.DEFAULT_PARALLELISM)
        return self

    def get_parallelism(self) -> int:
        """The parallelism operators get unless they set their own."""
        return self._config.get(CoreOptions.DEFAULT_PARALLELISM)

    def set_max_parallelism(self, max_parallelism: int) -> StreamExecutionEnvironment:
        """Number of key groups: the most subtasks keyed state can ever be rescaled to."""
        if not isinstance(max_parallelism, int) or not 1 <= max_parallelism <= 32768:
            raise ConfigurationError(
                f"invalid value for 'pipeline.max-parallelism': {max_parallelism!r}. "
                "Allowed: an integer >= 1 and <= 32768."
            )
        self._config.set(PipelineOptions.MAX_PARALLELISM, max_parallelism)
        return self

    def get_max_parallelism(self) -> int:
        """The number of key groups: the highest parallelism the job's keyed state can be rescaled to."""
        return self._config.get(PipelineOptions.MAX_PARALLELISM)

    def set_buffer_timeout(self, timeout_millis: int) -> StreamExecutionEnvironment:
        """Longest wait of a record produced by a busy task before it is sent (PyFlink's):
        a positive value bounds it, 0 sends every record at once, -1 sends only full batches
        (``execution.buffer-timeout``)."""
        self._config.set(ExecutionOptions.BUFFER_TIMEOUT, timeout_millis)
        self._config.get(ExecutionOptions.BUFFER_TIMEOUT)
        return self

    def get_buffer_timeout(self) -> int:
        """Milliseconds a record produced by a busy task may wait before it is sent (``execution.buffer-
        timeout``): the bound on latency that batching adds."""
        return self._config.get(ExecutionOptions.BUFFER_TIMEOUT)

    # ------------------------------------------------------------------ checkpointing

    def enable_checkpointing(
        self, interval: int, mode: CheckpointingMode | None = None
    ) -> StreamExecutionEnvironment:
        """Take a consistent checkpoint every ``interval`` ms (EXACTLY_ONCE unless ``mode``)."""
        config = self.get_checkpoint_config()
        config.set_checkpoint_interval(interval)
        if mode is not None:
            config.set_checkpointing_mode(mode)
        return self

    def get_checkpoint_config(self) -> CheckpointConfig:
        """The checkpoint settings (their setters write Flink's configuration keys)."""
        return CheckpointConfig(self._config)

    def get_checkpoint_interval(self) -> int:
        """The checkpoint interval in milliseconds (-1 when checkpointing is off, as in PyFlink)."""
        return self.get_checkpoint_config().get_checkpoint_interval()

    def get_checkpointing_mode(self) -> CheckpointingMode:
        """The checkpointing mode of the job's checkpoint configuration (``EXACTLY_ONCE`` or
        ``AT_LEAST_ONCE``)."""
        return self.get_checkpoint_config().get_checkpointing_mode()

    # ------------------------------------------------------------------ state backend

    def set_state_backend(self, state_backend: StateBackend) -> StreamExecutionEnvironment:
        """Where the job's keyed state lives: ``HashMapStateBackend()`` (the default, Python
        objects in memory) or ``EmbeddedRocksDBStateBackend(...)`` (RocksDB on local disk, for
        state larger than memory, with incremental checkpoints). Writes ``state.backend.type``
        and the backend's other keys into the configuration, as a config file would; see
        docs/state-backends.md."""
        if not isinstance(state_backend, StateBackend):
            raise TypeError(
                "set_state_backend() takes a state backend, HashMapStateBackend() or "
                "EmbeddedRocksDBStateBackend() from chandy.datastream.state_backend, got "
                f"{state_backend!r} ({type(state_backend).__name__}); to name one by its key, "
                'use env.configure({"state.backend.type": "rocksdb"})'
            )
        state_backend._write_to(self._config)
        return self

    def get_state_backend(self) -> StateBackend | None:
        """The state backend the configuration sets (by :meth:`set_state_backend` or the
        ``state.backend.type`` key), or ``None`` when none is set and the default,
        the hashmap backend, applies."""
        return state_backend_of(self._config)

    def set_restore_path(self, path: str) -> StreamExecutionEnvironment:
        """Start the next job from a retained checkpoint or savepoint (a ``chk-N``
        directory or its ``_metadata``); ``execution.state-recovery.path`` in configuration."""
        self._config.set(StateRecoveryOptions.PATH, path)
        return self

    def disable_operator_chaining(self) -> StreamExecutionEnvironment:
        """Run every operator in a task of its own (for debugging)."""
        self._config.set(PipelineOptions.OPERATOR_CHAINING, False)
        return self

    def is_chaining_enabled(self) -> bool:
        """Whether operators joined by forward edges run chained in one task (the default), which saves a
        hand-over per record."""
        return self._config.get(PipelineOptions.OPERATOR_CHAINING)

    # ------------------------------------------------------------------ sources

    def from_source(
        self,
        source: Source,
        watermark_strategy: WatermarkStrategy | None = None,
        source_name: str = "Source",
        type_info: Any = None,
    ) -> DataStream | BatchStream:
        """A stream read from ``source`` (a :class:`~chandy.core.connector.Source`): a
        :class:`DataStream` of records, or for a batch source (``source.columnar``: it reads
        Arrow record batches, ``chandy.network.arrow-batch-size`` rows at a time) a
        :class:`~chandy.api.batch_stream.BatchStream`.

        With a ``watermark_strategy`` the records get event timestamps and the source
        generates watermarks (per source subtask, every ``pipeline.auto-watermark-interval``);
        ``WatermarkStrategy.no_watermarks()`` or ``None`` for none. A batch source takes a
        strategy that names its event-time column (``with_timestamp_column("ts")``), never a
        per-record timestamp assigner (docs/batches.md, Event time)."""
        if not isinstance(source, Source):
            raise InvalidProgramError(f"from_source() takes a Source, got {type(source).__name__}")
        if watermark_strategy is not None and not isinstance(watermark_strategy, WatermarkStrategy):
            raise InvalidProgramError(
                "from_source(source, watermark_strategy, source_name): watermark_strategy must be "
                f"a WatermarkStrategy (or None), got {type(watermark_strategy).__name__}"
            )
        assigns_timestamps = watermark_strategy is not None and (
            watermark_strategy.emits_watermarks or watermark_strategy.create_timestamp_extractor() is not None
        )
        if source.columnar:
            _check_batch_source(source, source_name, type_info)
        check_columnar_watermarks(source, watermark_strategy)
        source.validate()
        if source.get_boundedness() is Boundedness.CONTINUOUS_UNBOUNDED:
            self._unbounded_sources.append(source_name)
        import functools

        node = self._stream_graph.add_node(
            source_name, functools.partial(SourceOperator, source, watermark_strategy), is_source=True
        )
        node.output_type = type_info
        node.assigns_timestamps = assigns_timestamps
        if source.columnar:
            from chandy.api.batch_stream import BatchStream

            node.columnar = True
            if watermark_strategy is not None:
                node.timestamp_column = watermark_strategy.timestamp_column
            return BatchStream._of(self, node)
        return DataStream._of(self, node)

    def from_collection(self, collection: Iterable[Any], type_info: Any = None) -> DataStream:
        """A bounded stream of the elements of ``collection``, in order (one subtask, as Flink's).

        With a ``type_info`` each element is what PyFlink's functions would receive
        (a tuple declared as a row type becomes a ``Row`` with its field names, ...)."""
        from chandy.connectors.collection import CollectionSource
        from chandy.core.types import to_declared_type

        if isinstance(collection, (str, bytes)) or not isinstance(collection, Iterable):
            raise InvalidProgramError(
                "from_collection() takes a list (or other iterable) of "
                f"records, got {type(collection).__name__}"
            )
        stream = self.from_source(
            CollectionSource([to_declared_type(record, type_info) for record in collection]),
            source_name="Collection Source",
            type_info=type_info,
        )
        assert isinstance(stream, DataStream) and stream._node is not None
        stream._node.parallelism = 1
        return stream

    def from_sequence(self, start: int, end: int) -> DataStream:
        """The integers ``start..end`` inclusive, read in parallel."""
        from chandy.connectors.number_sequence import NumberSequenceSource

        stream = self.from_source(NumberSequenceSource(start, end), source_name="Sequence Source")
        assert isinstance(stream, DataStream)
        return stream

    # ------------------------------------------------------------------ execution

    def _validated_config(self) -> Configuration:
        check_configuration(self._config)  # every key known, every value parses: a clear error now
        _check_combinations(self._config)
        return self._config.copy()

    def _build_job_graph(self, job_name: str | None, *, clear: bool = True) -> JobGraph:
        config = self._validated_config()
        name = job_name or config.get(PipelineOptions.NAME) or "chandy job"
        job_parameters = config.to_dict()
        for sink in self._sinks:  # in the job graph by reference: what they keep ships with it
            sink.configure(job_parameters)
        if (
            self._unbounded_sources
            and self._two_phase_sinks
            and config.get(CheckpointingOptions.INTERVAL) is None
        ):
            log.warning(
                "Job %s: sinks %s commit their output at checkpoints, but checkpointing is off "
                "and sources %s never end, so nothing they write will become visible. Call "
                "env.enable_checkpointing(interval_ms).",
                name,
                self._two_phase_sinks,
                self._unbounded_sources,
            )
        try:
            return create_job_graph(
                self._stream_graph,
                job_name=name,
                default_parallelism=config.get(CoreOptions.DEFAULT_PARALLELISM),
                default_max_parallelism=config.get(PipelineOptions.MAX_PARALLELISM),
                chaining_enabled=config.get(PipelineOptions.OPERATOR_CHAINING),
                config=config.to_dict(),
                job_id=config.get(PipelineOptions.FIXED_JOB_ID),
            )
        finally:
            if clear:
                self._stream_graph = StreamGraph()
                self._unbounded_sources, self._two_phase_sinks, self._sinks = [], [], []

    def _create_executor(self, config: Configuration) -> Executor:
        target = config.get(ExecutionOptions.TARGET)
        if target == "local":
            from chandy.runtime.local_executor import LocalExecutor

            return LocalExecutor()
        if target == "spark":
            from chandy.runtime.spark.executor import SparkExecutor

            return SparkExecutor(config, dashboard_url=self.rest_url)
        raise ConfigurationError(f"unknown executor '{target}'; use one of {', '.join(_EXECUTORS)}")

    def _web_service(self, config: Configuration) -> WebService | None:
        """The REST server's owner (``None`` with ``chandy.rest.enabled: false``)."""
        if not config.get(RestOptions.ENABLED):
            return None
        if self._web is None:
            from chandy.web.service import WebService

            self._web = WebService()
            # A forgotten environment must not keep its port open for the rest of the process.
            weakref.finalize(self, self._web.release_environment)
        return self._web

    @property
    def rest_url(self) -> str | None:
        """Where the REST API and the dashboard of this environment's jobs are served
        (``None`` while no server runs)."""
        return self._web.url if self._web is not None else None

    def close(self) -> None:
        """Stop the REST server now (running jobs go on; their clients still work).

        Without it the server stops once every job of the environment ended and the
        environment is no longer referenced (``chandy.web.service``)."""
        if self._web is not None:
            self._web.close()

    def __enter__(self) -> StreamExecutionEnvironment:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def execute(self, job_name: str | None = None) -> JobExecutionResult:
        """Run the pipeline defined so far; blocks until the job ends.

        Returns the job's result; raises :class:`~chandy.errors.JobExecutionError`
        (its ``__cause__`` is the exception a user function raised) if it failed
        for good (:class:`~chandy.errors.JobCancelledError` when it was cancelled). Ctrl-C
        and SIGTERM cancel the job and end its slots before they propagate, and print one
        line on how to resume it (:mod:`chandy.runtime.console`, docs/cli.md).

        The REST server serves the job while it runs; after its end, until every
        savepoint or stop a client asked for was fetched (Flink's CLI polls for the
        outcome of a stop after the job finished), at most
        ``chandy.rest.await-results-timeout``.
        """
        job_graph = self._build_job_graph(job_name)
        config = Configuration(job_graph.config)
        web = self._web_service(config)
        hold = web.acquire(config) if web is not None else None
        console.announce_rest_address(self.rest_url, job_graph.job_name, job_graph.job_id)
        console.announce_driver()
        try:
            executor = self._create_executor(config)
            try:
                job_master = JobMaster(job_graph, executor, rest_url=self.rest_url)
                if web is not None:
                    web.dispatcher.submit(job_master)
                with console.terminate_on_sigterm():
                    try:
                        with show_status_line(job_master, config, self.rest_url):  # on a terminal only
                            return job_master.run()
                    except (KeyboardInterrupt, console.Terminated) as interrupt:
                        # run() cancelled the tasks; the slots end before the line is printed,
                        # so that nothing they cause follows it (docs/cli.md)
                        executor.close()
                        how = "Ctrl-C"
                        if isinstance(interrupt, console.Terminated):
                            executor.end_process()
                            how = "SIGTERM"
                        console.write(console.interrupted_line(job_master, how))
                        console.mark_reported(interrupt)
                        raise
                    except (JobCancelledError, console.SetupError):
                        console.install_excepthook()  # uncaught, each ends in one line
                        raise
            finally:
                executor.close()
        finally:
            if hold is not None:
                hold.release()

    def _start_job(self, job_name: str | None, results: CollectResultQueue | None = None) -> JobClient:
        """Start a job on a thread of its own; the REST server serves it until it ended and
        the environment is closed or gone (``chandy.web.service``)."""
        job_graph = self._build_job_graph(job_name)
        config = Configuration(job_graph.config)
        web = self._web_service(config)
        hold = web.acquire(config, for_environment=True) if web is not None else None
        console.announce_rest_address(self.rest_url, job_graph.job_name, job_graph.job_id)
        console.announce_driver()
        try:
            executor = self._create_executor(config)
        except BaseException:
            if hold is not None:
                hold.release()
            raise
        job_master = JobMaster(job_graph, executor, results=results, rest_url=self.rest_url)
        if web is not None:
            web.dispatcher.submit(job_master)

        def ended(error: BaseException | None) -> None:
            try:
                executor.close()  # release the executor before the reader sees the end
                if hold is not None:  # before the end is seen: the program may exit at once
                    hold.release_in_background()
            finally:  # a reader waits for the end: it must come, whatever closing raised
                if results is not None:
                    results.end(error)

        return JobClient(job_master, on_end=ended)

    def execute_async(self, job_name: str | None = None) -> JobClient:
        """Start the pipeline defined so far and return at once with a :class:`JobClient`
        (status, checkpoint statistics, savepoints, cancel, result). The REST server serves
        it, and keeps it listed after its end, until :meth:`close` (or until the environment
        is no longer referenced and its jobs ended)."""
        return self._start_job(job_name)

    def _execute_and_collect(self, job_name: str | None) -> CollectIterator:
        results = CollectResultQueue()
        return CollectIterator(self._start_job(job_name, results), results)

    def get_execution_plan(self) -> str:
        """The chained plan of the pipeline defined so far, as JSON (nothing is run)."""
        job_graph = self._build_job_graph(None, clear=False)
        return json.dumps(
            {
                "jid": job_graph.job_id,
                "name": job_graph.job_name,
                "nodes": [
                    {
                        "id": v.id,
                        "description": v.name,
                        "operators": [op.name for op in v.operators],
                        "parallelism": v.parallelism,
                        "max_parallelism": v.max_parallelism,
                        "inputs": [
                            {"id": e.source_vertex_id, "ship_strategy": e.partitioner.name} for e in v.inputs
                        ],
                    }
                    for v in job_graph.vertices
                ],
            },
            indent=2,
        )


def _check_batch_source(source: Source, source_name: str, type_info: Any) -> None:
    """What ``from_source`` refuses for a batch source, with the way out (its watermark
    strategy is checked by ``check_columnar_watermarks``)."""
    if type_info is not None:
        raise InvalidProgramError(
            f"from_source({type(source).__name__}, ...) ('{source_name}'): type_info declares the "
            "type of records; a batch source's batches carry their own Arrow schema, so leave it out"
        )


def _check_combinations(config: Configuration) -> None:
    """Reject settings that parse one by one but make no sense together."""
    checkpointing = config.get(CheckpointingOptions.INTERVAL) is not None
    directory = config.get(CheckpointingOptions.DIRECTORY)
    storage = config.get(CheckpointingOptions.STORAGE)
    retention = config.get(CheckpointingOptions.EXTERNALIZED_RETENTION)
    if storage == "filesystem" and not directory:
        raise ConfigurationError(
            "execution.checkpointing.storage is 'filesystem' but execution.checkpointing.dir is "
            "not set: set the directory (a path or URI every executor can write)"
        )
    if (
        checkpointing
        and retention is not ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS
        and (not directory or storage == "jobmanager")
    ):
        raise ConfigurationError(
            f"execution.checkpointing.externalized-checkpoint-retention is {retention.name}, but "
            "checkpoints are kept in memory and cannot outlive the job: set "
            "execution.checkpointing.dir (env.get_checkpoint_config().set_checkpoint_storage(...))"
        )
    restart_strategy_from(config)  # an exponential delay whose bounds contradict each other
    ignored = ignored_restart_keys(config)
    if ignored:
        log.warning(
            "%s %s no effect: the job's restart strategy is %s%s. Set restart-strategy.type to the "
            "strategy they configure, or remove them.",
            ", ".join(ignored),
            "has" if len(ignored) == 1 else "have",
            restart_strategy_from(config).describe(),
            ""
            if checkpointing or config.get(RestartStrategyOptions.TYPE) is not None
            else " (checkpointing is off and restart-strategy.type unset: Flink's default is no restarts)",
        )
    if checkpointing:
        check_unaligned_settings(
            config.get(CheckpointingOptions.UNALIGNED),
            config.get(CheckpointingOptions.MODE) is CheckpointingMode.EXACTLY_ONCE,
            config.get(CheckpointingOptions.MAX_CONCURRENT),
        )
