"""Every configuration key chandy understands, by Flink's names where Flink has one.

Grouped as Flink groups them. ``ALL_OPTIONS`` is what ``execute()`` checks the
user's keys against, so a misspelt key is an error, not silently ignored.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable
from typing import Any

from chandy.config.configuration import ConfigOption, Configuration, parse_duration_ms
from chandy.errors import ConfigurationError

UPPER_BOUND_MAX_PARALLELISM = 32768


def _parse_buffer_timeout(value: Any) -> int:
    """A duration, or -1: Flink's "flush only full buffers" (``setBufferTimeout(-1)``)."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        if str(value).strip().lower() in ("-1", "-1.0", "-1ms", "-1 ms"):
            return -1
    return parse_duration_ms(value)


def _octal_mode(value: Any) -> int:
    """A permission mode written in octal, as a string: ``"600"``, ``"0640"``, ``"0o750"``.

    A number is refused: YAML reads an unquoted ``0640`` as 416 and ``640`` as six hundred
    and forty, and neither is what the user meant.
    """
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quoted octal mode (write it as a string, e.g. '640')")
    text = value.strip().lower().removeprefix("0o")
    if not text or len(text) > 4 or any(c not in "01234567" for c in text):
        raise ValueError(f"{value!r} is not an octal mode")
    return int(text, 8)


def _mode_check(what: str, owner: int, allowed: int) -> Any:
    """Refuses a mode that takes the job's own access away or lets every local user write."""

    def check(mode: int) -> None:
        if mode & ~allowed:
            raise ValueError(f"{mode:o} has bits a {what} mode may not have (at most {allowed:o})")
        if mode & owner != owner:
            raise ValueError(f"{mode:o} takes away the owner's access ({owner:o}) the job needs")
        if mode & 0o002:
            raise ValueError(f"{mode:o} lets every local user write the job's checkpoints")

    return check


class PipelineOptions:
    """The ``pipeline.*`` keys: job name and id, max parallelism, operator chaining, watermark interval."""

    NAME = ConfigOption.string("pipeline.name", None, "The job name when execute() is given none.")
    FIXED_JOB_ID = ConfigOption.string(
        "$internal.pipeline.job-id",
        None,
        "A fixed job id (32 hex digits, Flink's JobID). With a checkpoint directory on shared "
        "storage, a job submitted again under the same id (its driver died) resumes from its "
        "latest completed checkpoint, checkpoint ids continuing.",
        deprecated_keys=("chandy.job-id",),
    )
    MAX_PARALLELISM = ConfigOption.integer(
        "pipeline.max-parallelism",
        -1,
        "Number of key groups; the upper bound for rescaling keyed state. -1 derives it from "
        "the parallelism as Flink does.",
        minimum=-1,
        maximum=UPPER_BOUND_MAX_PARALLELISM,
    )
    OPERATOR_CHAINING = ConfigOption.boolean(
        "pipeline.operator-chaining.enabled",
        True,
        "Chain operators joined by forward edges of equal parallelism into one task.",
        deprecated_keys=("pipeline.operator-chaining",),
    )
    AUTO_WATERMARK_INTERVAL = ConfigOption.duration(
        "pipeline.auto-watermark-interval",
        200,
        "How often sources (and assign_timestamps_and_watermarks) ask their watermark "
        "generator for a new watermark; 0 turns periodic watermarks off.",
    )


class CoreOptions:
    """``parallelism.default``: the parallelism of operators that set none."""

    DEFAULT_PARALLELISM = ConfigOption.integer(
        "parallelism.default",
        1,
        "Parallelism of operators that set none.",
        minimum=1,
        maximum=UPPER_BOUND_MAX_PARALLELISM,
    )


class CheckpointingMode(enum.Enum):
    """How barriers are handled: aligned exactly-once, or tracked at-least-once."""

    EXACTLY_ONCE = "EXACTLY_ONCE"
    AT_LEAST_ONCE = "AT_LEAST_ONCE"


class ExternalizedCheckpointRetention(enum.Enum):
    """What happens to completed checkpoints when the job ends (Flink's names)."""

    #: Keep them when the job is cancelled or fails; delete them when it finishes.
    RETAIN_ON_CANCELLATION = "RETAIN_ON_CANCELLATION"
    #: Keep them when the job fails; delete them when it is cancelled or finishes.
    DELETE_ON_CANCELLATION = "DELETE_ON_CANCELLATION"
    #: Delete them whenever the job ends.
    NO_EXTERNALIZED_CHECKPOINTS = "NO_EXTERNALIZED_CHECKPOINTS"


#: PyFlink 1.x name of the same choice.
ExternalizedCheckpointCleanup = ExternalizedCheckpointRetention


class RecoveryClaimMode(enum.Enum):
    """Who owns the files of the snapshot a job is restored from (Flink's ``RecoveryClaimMode``)."""

    NO_CLAIM = "NO_CLAIM"
    CLAIM = "CLAIM"


class SavepointFormatType(enum.Enum):
    """How a savepoint stores state (Flink's ``SavepointFormatType``).

    CANONICAL is independent of the state backend, so a job can switch backends through
    it; NATIVE is the backend's own format (faster to take and restore)."""

    CANONICAL = "CANONICAL"
    NATIVE = "NATIVE"
    DEFAULT = "CANONICAL"


class CheckpointingOptions:
    """The ``execution.checkpointing.*`` keys (checkpointing.md lists each with its default)."""

    INTERVAL = ConfigOption.duration(
        "execution.checkpointing.interval",
        None,
        "Time between the starts of two periodic checkpoints; unset means no periodic checkpoints.",
        minimum_ms=10,
    )
    MODE = ConfigOption.enumeration(
        "execution.checkpointing.mode",
        CheckpointingMode,
        CheckpointingMode.EXACTLY_ONCE,
        "EXACTLY_ONCE aligns barriers; AT_LEAST_ONCE never blocks an input.",
    )
    TIMEOUT = ConfigOption.duration(
        "execution.checkpointing.timeout",
        600_000,
        "A checkpoint not completed within this time is aborted (CHECKPOINT_EXPIRED).",
        minimum_ms=10,
    )
    MIN_PAUSE = ConfigOption.duration(
        "execution.checkpointing.min-pause",
        0,
        "Least time from the completion of one checkpoint to the start of the next.",
    )
    MAX_CONCURRENT = ConfigOption.integer(
        "execution.checkpointing.max-concurrent-checkpoints",
        1,
        "Checkpoints that may be in progress at once.",
        minimum=1,
    )
    TOLERABLE_FAILURES = ConfigOption.integer(
        "execution.checkpointing.tolerable-failed-checkpoints",
        0,
        "Consecutive checkpoint failures (declined, expired, failed to write) tolerated before "
        "the job fails over.",
        minimum=0,
    )
    EXTERNALIZED_RETENTION = ConfigOption.enumeration(
        "execution.checkpointing.externalized-checkpoint-retention",
        ExternalizedCheckpointRetention,
        ExternalizedCheckpointRetention.NO_EXTERNALIZED_CHECKPOINTS,
        "Whether completed checkpoints survive the job's cancellation or failure.",
        deprecated_keys=("execution.checkpointing.externalized-checkpoint-retention.enabled",),
    )
    STORAGE = ConfigOption.string(
        "execution.checkpointing.storage",
        None,
        "'jobmanager' keeps checkpoints in the JobMaster's memory; 'filesystem' writes them to "
        "execution.checkpointing.dir. Default: filesystem when a directory is set.",
        choices=("jobmanager", "filesystem"),
        deprecated_keys=("state.checkpoint-storage",),
    )
    DIRECTORY = ConfigOption.string(
        "execution.checkpointing.dir",
        None,
        "Where checkpoints are written: a path or URI (file://, s3://, hdfs://, memory://).",
        deprecated_keys=("state.checkpoints.dir", "state.backend.fs.checkpointdir"),
    )
    SAVEPOINT_DIRECTORY = ConfigOption.string(
        "execution.checkpointing.savepoint-dir",
        None,
        "Default directory for savepoints (a path or URI) when a savepoint request names none.",
        deprecated_keys=("state.savepoints.dir",),
    )
    FILE_PERMISSIONS: ConfigOption[int] = ConfigOption(
        "execution.checkpointing.file-permissions",
        0o600,
        "The mode (octal, as a string) of every file written to checkpoint and savepoint "
        "directories on a local or mounted filesystem: only the job's user reads its state by "
        "default. '640' lets the directory's group read them (shared storage, with "
        "dir-permissions '750'). Object stores (s3://, gs://, ...) ignore it.",
        _octal_mode,
        "a quoted octal mode with the owner's rw bits (600) and no one else's write bit, e.g. '600', '640'",
        check=_mode_check("file", 0o600, 0o777),
    )
    DIR_PERMISSIONS: ConfigOption[int] = ConfigOption(
        "execution.checkpointing.dir-permissions",
        0o700,
        "The mode (octal, as a string) of every directory chandy creates for checkpoints and "
        "savepoints (the job's directory, chk-N, shared, taskowned, savepoint-*) on a local or "
        "mounted filesystem. Directories that already exist keep theirs. '750' (or '2750', "
        "setgid) opens them to the group. Object stores ignore it.",
        _octal_mode,
        "a quoted octal mode with the owner's rwx bits (700) and no one else's write bit, e.g. '700', '750'",
        check=_mode_check("directory", 0o700, 0o2777),
    )
    SNAPSHOT_KEY_FILE = ConfigOption.string(
        "execution.checkpointing.snapshot-key-file",
        None,
        "A file holding the secret that signs every checkpoint and savepoint this deployment "
        "writes and authenticates every one it restores (HMAC-SHA256 over _metadata). The "
        "environment variable CHANDY_SNAPSHOT_KEY, if set, wins. Unset: a key generated once "
        "into <execution.checkpointing.dir>/.chandy-snapshot-key (mode 0600), else into "
        "<execution.checkpointing.savepoint-dir>/.chandy-snapshot-key. See docs/security.md.",
    )
    NUM_RETAINED = ConfigOption.integer(
        "execution.checkpointing.num-retained",
        1,
        "Completed checkpoints kept.",
        minimum=1,
        deprecated_keys=("state.checkpoints.num-retained",),
    )
    CREATE_SUBDIR = ConfigOption.boolean(
        "execution.checkpointing.create-subdir",
        True,
        "Write checkpoints under <dir>/<job-id>/.",
        deprecated_keys=("state.checkpoints.create-subdir",),
    )
    INLINE_THRESHOLD = ConfigOption.memory_size(
        "execution.checkpointing.data-inline-threshold",
        20 * 1024,
        "State smaller than this is stored inside _metadata instead of its own file.",
        maximum=1 << 20,
        deprecated_keys=("state.storage.fs.memory-threshold",),
    )
    INCREMENTAL = ConfigOption.boolean(
        "execution.checkpointing.incremental",
        False,
        "Checkpoints write only what changed since the last completed one (the RocksDB state "
        "backend: new SST files go to shared/ once and later checkpoints reference them). The "
        "hashmap backend ignores it.",
        deprecated_keys=("state.backend.incremental",),
    )
    CHECKPOINTS_AFTER_TASKS_FINISH = ConfigOption.boolean(
        "execution.checkpointing.checkpoints-after-tasks-finish",
        True,
        "Checkpoint on after some tasks finished, and take a final checkpoint when bounded "
        "sources end, so two-phase-commit sinks commit their last records before the job "
        "finishes (Flink's FLIP-147). An input that ends during alignment counts as aligned. "
        "Off: an input that ends during alignment aborts that checkpoint, and sinks commit their "
        "last records at end of input.",
        deprecated_keys=("execution.checkpointing.checkpoints-after-tasks-finish.enabled",),
    )
    UNALIGNED = ConfigOption.boolean(
        "execution.checkpointing.unaligned.enabled",
        False,
        "Unaligned checkpoints (EXACTLY_ONCE only): the first barrier at a task overtakes the "
        "data queued in its channels, the task snapshots at once, and the data the barrier "
        "overtook is written with the checkpoint as channel state. Checkpoints stay fast under "
        "backpressure; savepoints are always aligned.",
        deprecated_keys=("execution.checkpointing.unaligned",),
    )
    ALIGNED_CHECKPOINT_TIMEOUT = ConfigOption.duration(
        "execution.checkpointing.aligned-checkpoint-timeout",
        0,
        "With unaligned checkpoints enabled: 0 makes every checkpoint unaligned; a positive "
        "value starts each checkpoint aligned and switches it to unaligned at a task whose "
        "alignment has not finished this long after the checkpoint started.",
        deprecated_keys=("execution.checkpointing.alignment-timeout",),
    )
    FORCE_UNALIGNED = ConfigOption.boolean(
        "execution.checkpointing.unaligned.forced",
        False,
        "Accepted for Flink compatibility. Flink keeps some jobs (iterations) aligned unless "
        "forced; chandy has none of them, so unaligned checkpoints, once enabled, apply to every "
        "job whatever this value.",
    )
    MAX_SUBTASKS_PER_CHANNEL_STATE_FILE = ConfigOption.integer(
        "execution.checkpointing.unaligned.max-subtasks-per-channel-state-file",
        5,
        "Accepted for Flink compatibility and validated (at least 1). chandy writes the channel "
        "state of one subtask into one file per checkpoint (or inline in _metadata when smaller "
        "than execution.checkpointing.data-inline-threshold), whatever this value.",
        minimum=1,
    )


class StateBackendOptions:
    """The ``state.backend.*`` keys: which state backend keeps keyed state."""

    TYPE = ConfigOption.string(
        "state.backend.type",
        "hashmap",
        "Where keyed state lives: 'hashmap' keeps Python objects on the heap (fast, bounded by "
        "memory); 'rocksdb' keeps serialized state in an embedded RocksDB per operator subtask "
        "(larger than memory, incremental checkpoints).",
        choices=("hashmap", "rocksdb"),
        deprecated_keys=("state.backend",),
    )


class RocksDBOptions:
    """The RocksDB state backend's keys: memory per slot, local directory, incremental checkpoints."""

    MEMORY_MANAGED = ConfigOption.boolean(
        "state.backend.rocksdb.memory.managed",
        True,
        "Bound the RocksDB state of each slot (block cache, write buffers and chandy's cache of "
        "decoded values together) by taskmanager.memory.managed.size.",
    )
    MANAGED_SIZE = ConfigOption.memory_size(
        "taskmanager.memory.managed.size",
        128 * 1024 * 1024,
        "Memory for RocksDB state per slot (one Spark task, or one parallel slice of the job "
        "under the local executor) when state.backend.rocksdb.memory.managed is true.",
        maximum=1 << 42,
    )
    FIXED_PER_SLOT = ConfigOption.memory_size(
        "state.backend.rocksdb.memory.fixed-per-slot",
        0,
        "A fixed memory budget for RocksDB state per slot; overrides the managed size when set (0: not set).",
        maximum=1 << 42,
    )
    LOCAL_DIRECTORIES = ConfigOption.string(
        "state.backend.rocksdb.localdir",
        None,
        "Local working directory of the RocksDB instances (default: the system's temporary "
        "directory). Fast local disk: every state access may read it.",
    )


def _module_list(value: Any) -> tuple[str, ...]:
    """Module names as a list, or as one string separated by ``;`` or ``,`` (Flink's list
    syntax); ``pkg.*`` stands for a package and every module under it."""
    if value is None:
        return ()
    if isinstance(value, str):
        entries: list[Any] = [part.strip() for part in value.replace(",", ";").split(";")]
    elif isinstance(value, (list, tuple)):
        entries = [part.strip() if isinstance(part, str) else part for part in value]
    else:
        raise ValueError(f"{value!r} is not a list of module names")
    modules: list[str] = []
    for entry in entries:
        if entry == "":
            continue
        dotted = entry[:-2] if isinstance(entry, str) and entry.endswith(".*") else entry
        if not isinstance(dotted, str) or not all(part.isidentifier() for part in dotted.split(".")):
            raise ValueError(f"{entry!r} is not a module name (such as 'mypackage.records' or 'mypackage.*')")
        modules.append(entry)
    return tuple(modules)


class StateRecoveryOptions:
    """The ``execution.state-recovery.*`` keys: what to restore from and how (claim mode, unclaimed state,
    trusted snapshots)."""

    PATH = ConfigOption.string(
        "execution.state-recovery.path",
        None,
        "Start the job from this retained checkpoint or savepoint (a chk-N directory or its _metadata file).",
        deprecated_keys=("execution.savepoint.path",),
    )
    IGNORE_UNCLAIMED_STATE = ConfigOption.boolean(
        "execution.state-recovery.ignore-unclaimed-state",
        False,
        "Skip state of operators that no longer exist instead of refusing to start.",
        deprecated_keys=("execution.savepoint.ignore-unclaimed-state",),
    )
    CLAIM_MODE = ConfigOption.enumeration(
        "execution.state-recovery.claim-mode",
        RecoveryClaimMode,
        RecoveryClaimMode.NO_CLAIM,
        "Who owns the snapshot a job starts from: NO_CLAIM (chandy never deletes it; the first "
        "checkpoint after the restore is self-contained) or CLAIM (the job takes ownership and "
        "deletes it once a newer checkpoint subsumes it).",
        deprecated_keys=("execution.savepoint-restore-mode",),
    )
    TRUST_SNAPSHOT = ConfigOption.boolean(
        "execution.state-recovery.trust-snapshot",
        False,
        "Restore a checkpoint or savepoint that this deployment's snapshot key does not "
        "authenticate (unsigned, from an older chandy, or signed with another deployment's "
        "key), with a warning. Restoring unpickles its state, which runs code: only for a "
        "snapshot whose origin you trust (chandy run --trust-snapshot).",
    )
    ALLOWED_PICKLE_MODULES: ConfigOption[tuple[str, ...]] = ConfigOption(
        "execution.state-recovery.allowed-pickle-modules",
        (),
        "Modules a restore may unpickle anything from (classes and functions), besides plain "
        "data, chandy's own classes and the classes of the job's own modules: e.g. "
        "'mypackage.records;mypackage.util.*' ('pkg.*': a package and its submodules). Only "
        "for modules your state legitimately holds objects of: a restore refuses every other "
        "name a pickle gives (see docs/security.md). Declaring Types on a state makes it data "
        "and needs none of this.",
        _module_list,
        "a list of module names (a YAML list, or one string separated by ';' or ',')",
    )


class RestartStrategyOptions:
    """The ``restart-strategy.*`` keys: whether and how a failed job restarts from its latest checkpoint."""

    TYPE = ConfigOption.string(
        "restart-strategy.type",
        None,
        "How a failed job restarts: 'exponential-delay', 'fixed-delay', or 'none'. Default (as "
        "in Flink 2): exponential-delay when checkpointing is on, none otherwise.",
        choices=(
            "exponential-delay",
            "exponentialdelay",
            "fixed-delay",
            "fixeddelay",
            "none",
            "off",
            "disable",
            "no_restart",
        ),
        deprecated_keys=("restart-strategy",),
    )
    ATTEMPTS = ConfigOption.integer(
        "restart-strategy.fixed-delay.attempts",
        None,
        "fixed-delay: restarts before the job fails for good (default 1, Flink's).",
        minimum=0,
    )
    DELAY = ConfigOption.duration(
        "restart-strategy.fixed-delay.delay", 1000, "fixed-delay: wait between a failure and the restart."
    )
    INITIAL_BACKOFF = ConfigOption.duration(
        "restart-strategy.exponential-delay.initial-backoff",
        1000,
        "exponential-delay: the wait before the first restart (and after a reset).",
        minimum_ms=1,
    )
    MAX_BACKOFF = ConfigOption.duration(
        "restart-strategy.exponential-delay.max-backoff",
        60_000,
        "exponential-delay: the longest wait between a failure and the restart.",
        minimum_ms=1,
    )
    BACKOFF_MULTIPLIER = ConfigOption.number(
        "restart-strategy.exponential-delay.backoff-multiplier",
        1.5,
        "exponential-delay: each restart waits this many times longer than the one before.",
        above=1.0,
    )
    RESET_BACKOFF_THRESHOLD = ConfigOption.duration(
        "restart-strategy.exponential-delay.reset-backoff-threshold",
        3_600_000,
        "exponential-delay: a job that ran this long since its last restart starts again from "
        "the initial backoff (and a fresh count of attempts).",
        minimum_ms=1,
    )
    JITTER_FACTOR = ConfigOption.number(
        "restart-strategy.exponential-delay.jitter-factor",
        0.1,
        "exponential-delay: each wait is moved by a random amount up to this fraction of it, "
        "so that many jobs failing together do not restart together.",
        minimum=0.0,
        maximum=1.0,
    )
    ATTEMPTS_BEFORE_RESET = ConfigOption.integer(
        "restart-strategy.exponential-delay.attempts-before-reset-backoff",
        None,
        "exponential-delay: restarts before the job fails for good, counted since the last "
        "reset (default: unlimited).",
        minimum=1,
    )

    #: The keys of each strategy, by its canonical name: a key of a strategy that is not the
    #: one in use would be ignored without a word, so it is refused (see restart_strategy.py).
    @staticmethod
    def keys_of(kind: str) -> tuple[str, ...]:
        """The keys of restart strategy ``kind`` ('fixed-delay', 'exponential-delay'), to
        tell a user which keys the strategy in use ignores."""
        prefix = f"restart-strategy.{kind}."
        return tuple(o.key for o in all_options() if o.key.startswith(prefix))


class S3Options:
    """How ``s3://`` (and ``s3a://``) paths are reached: checkpoints, savepoints, the snapshot
    key and the file and Delta sinks. Flink's keys (its S3 filesystems read them from the
    Flink configuration), so a Flink user's configuration works as it is. Unset, botocore's
    own chain applies: the ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_ENDPOINT_URL``
    environment variables (taken where the job is submitted and shipped to every task),
    ``~/.aws``, an instance role. A key set here wins over the environment."""

    ENDPOINT = ConfigOption.string(
        "s3.endpoint",
        None,
        "The S3 endpoint URL, e.g. 'http://127.0.0.1:8333' for an S3-compatible server (MinIO, "
        "SeaweedFS, Ceph); unset: AWS_ENDPOINT_URL, else AWS itself. A bare host:port means "
        "https (as in Hadoop's S3A): write http:// for a plain-HTTP server.",
    )
    ACCESS_KEY = ConfigOption.string(
        "s3.access-key",
        None,
        "The access key id; unset: AWS_ACCESS_KEY_ID, else botocore's credential chain.",
        deprecated_keys=("s3.access.key",),
    )
    SECRET_KEY = ConfigOption.string(
        "s3.secret-key",
        None,
        "The secret access key; unset: AWS_SECRET_ACCESS_KEY, else botocore's credential chain. "
        "Never logged nor shown by the REST API.",
        deprecated_keys=("s3.secret.key",),
    )
    PATH_STYLE_ACCESS = ConfigOption.boolean(
        "s3.path.style.access",
        False,
        "Address buckets as <endpoint>/<bucket>/<key> instead of <bucket>.<endpoint>/<key>: "
        "what most S3-compatible servers need. false leaves the choice to botocore, which uses "
        "path style anyway for an endpoint that is an IP address.",
    )


class SparkOptions:
    """The ``chandy.spark.*`` keys: how long to wait for slots, when a silent slot counts as hung."""

    SLOT_WAIT = ConfigOption.duration(
        "chandy.spark.slot-wait",
        30_000,
        "How long a job waits for Spark to offer enough task slots (executors registering, a "
        "lost executor being replaced) before it fails with the number needed and available.",
    )
    HEARTBEAT_TIMEOUT = ConfigOption.duration(
        "chandy.spark.heartbeat-timeout",
        30_000,
        "A slot that sends no heartbeat for this long is considered lost.",
        minimum_ms=1000,
    )


class WebOptions:
    """The ``web.*`` keys: how much checkpoint history the dashboard and REST API keep."""

    CHECKPOINTS_HISTORY = ConfigOption.integer(
        "web.checkpoints.history", 10, "Checkpoints kept in the statistics history.", minimum=1
    )


class RestOptions:
    """The ``rest.*`` keys: where the REST API and dashboard listen and who may call them."""

    ENABLED = ConfigOption.boolean(
        "chandy.rest.enabled",
        True,
        "Serve Flink's REST API, the dashboard and Prometheus metrics from the driver.",
    )
    ADDRESS = ConfigOption.string(
        "rest.address", None, "The address clients use to reach the REST API (default: the bind address)."
    )
    BIND_ADDRESS = ConfigOption.string(
        "rest.bind-address",
        "127.0.0.1",
        "Interface the REST server listens on. Anything but loopback requires rest.auth.token.",
    )
    PORT = ConfigOption.integer(
        "rest.port",
        8081,
        "Port of the REST API and dashboard. 0 picks a free port. When rest.bind-port is not "
        "set and this port is taken, the next free one of the following 100 is used.",
        minimum=0,
        maximum=65535,
    )
    BIND_PORT = ConfigOption.string(
        "rest.bind-port",
        None,
        "A port or a range ('50100-50200') to listen on, taken strictly: no port of it free is an error.",
    )
    AUTH_TOKEN = ConfigOption.string(
        "rest.auth.token",
        None,
        "Bearer token every REST request must carry ('Authorization: Bearer <token>'), at least "
        "16 characters. Required when rest.bind-address is not loopback. With a token, a taken "
        "rest.port is an error instead of a move to the next free port.",
    )
    ALLOWED_HOSTS = ConfigOption.string(
        "rest.allowed-hosts",
        None,
        "Host names (comma-separated) a request's Host header may name besides localhost, IP "
        "addresses, rest.bind-address and rest.address: the names clients reach the driver by. "
        "Any other name is refused (403), which defeats DNS rebinding. '*' allows any name.",
    )
    MAX_CONTENT_LENGTH = ConfigOption.memory_size(
        "rest.server.max-content-length",
        1 << 20,
        "Largest request body the REST server reads; a larger one is refused with 413 before "
        "it is read (Flink's key; chandy's default is 1 mb, as no route takes more).",
        maximum=1 << 30,
    )
    AWAIT_RESULTS_TIMEOUT = ConfigOption.duration(
        "chandy.rest.await-results-timeout",
        10_000,
        "After a job ended, how long the server stays up for clients to fetch the outcome of a "
        "savepoint or stop they asked for (Flink's CLI polls for it).",
    )


class MetricOptions:
    """The metrics keys: how often tasks report their metrics to the driver."""

    REPORT_INTERVAL = ConfigOption.duration(
        "chandy.metrics.report-interval",
        1000,
        "How often tasks report their metrics (records, busy and backpressured time, "
        "watermarks) to the driver.",
        minimum_ms=10,
    )
    STATUS_LINE = ConfigOption.boolean(
        "chandy.status-line.enabled",
        True,
        "On a terminal, execute() shows a one-line live status (never in logs or non-TTY output).",
    )


class ExecutionOptions:
    """The ``execution.*`` keys: where the job runs (Spark or local) and the buffer timeout."""

    TARGET = ConfigOption.string(
        "execution.target",
        "spark",
        "Where the job runs: 'spark' (the active SparkSession, or a local one; slot i of a "
        "barrier stage runs subtask i of every operator) or 'local' (every subtask a thread "
        "of this process).",
        choices=("spark", "local"),
    )
    BUFFER_TIMEOUT: ConfigOption[int] = ConfigOption(
        "execution.buffer-timeout",
        100,
        "Longest time a record produced by a busy task waits before it is sent (Flink's buffer "
        "timeout), even while the task is inside one long function call. An idle task sends "
        "at once. 0 sends every record as soon as it is produced (lowest latency, least "
        "throughput); -1 sends only full batches (chandy.network.batch-size records) and what "
        "an event (watermark, barrier, end of input) pushes out, not even when the task goes idle.",
        _parse_buffer_timeout,
        "a duration such as 100, '100 ms' or '1 s', or -1",
        ("execution.buffer-timeout.interval",),
    )
    BUFFER_TIMEOUT_ENABLED = ConfigOption.boolean(
        "execution.buffer-timeout.enabled",
        True,
        "False: only full batches leave, as with execution.buffer-timeout -1 (Flink's switch).",
    )


class NetworkOptions:
    """The network keys: records per batch and credits per channel, which bound the data in flight."""

    BATCH_SIZE = ConfigOption.integer(
        "chandy.network.batch-size",
        1024,
        "Records per batch, the unit that crosses a channel (Flink's network buffer). A "
        "partly filled batch leaves when its task goes idle or within execution.buffer-timeout.",
        minimum=1,
        maximum=1 << 20,
    )
    ARROW_BATCH_SIZE = ConfigOption.integer(
        "chandy.network.arrow-batch-size",
        65536,
        "Rows per Arrow record batch on the batch path (BatchStream): what a batch source "
        "reads at a time, and how many rows a batch edge gathers per channel before it sends "
        "them (Spark's spark.sql.execution.arrow.maxRecordsPerBatch); one item sent holds "
        "fewer than twice this many rows (a buffer of twice or more is sent in slices of "
        "this size), and at most 64 MiB. A partly filled batch leaves as on the record path: "
        "when its task goes idle or after execution.buffer-timeout. From 1 to 16,777,216.",
        minimum=1,
        maximum=1 << 24,
    )
    BUFFERS_PER_CHANNEL = ConfigOption.integer(
        "taskmanager.network.memory.buffers-per-channel",
        4,
        "Credits per input channel: batches a receiver accepts before its senders block (backpressure).",
        minimum=1,
        maximum=1 << 16,
    )


def all_options() -> list[ConfigOption[Any]]:
    """Every option declared in this module."""
    found: list[ConfigOption[Any]] = []
    for holder in (
        PipelineOptions,
        CoreOptions,
        ExecutionOptions,
        NetworkOptions,
        CheckpointingOptions,
        StateBackendOptions,
        RocksDBOptions,
        StateRecoveryOptions,
        RestartStrategyOptions,
        WebOptions,
        RestOptions,
        MetricOptions,
        SparkOptions,
        S3Options,
    ):
        found.extend(v for v in vars(holder).values() if isinstance(v, ConfigOption))
    return found


#: Flink's buffer-debloating keys: refused with their own message, not "unknown key".
_BUFFER_DEBLOAT_PREFIX = "taskmanager.network.memory.buffer-debloat."

#: Key prefixes other parts own: ``spark.*`` goes to the Spark session chandy starts.
OWNED_ELSEWHERE = ("spark.",)


def check_configuration(config: Configuration, where: Callable[[str], str] | None = None) -> None:
    """Every key of ``config`` is known and every value parses, or one
    :class:`~chandy.errors.ConfigurationError` naming the first bad key (``where(key)``, when
    given, says where it was written: a file and line, a command-line option), the value and
    what is allowed. Run where settings enter (a file read, ``chandy run``'s ``-D``) as well as
    at ``execute()``: a bad value that the program overrides later is still a mistake."""
    options = all_options()
    located = where or (lambda key: "")
    for key in config.unknown_keys(options, prefixes_owned_elsewhere=OWNED_ELSEWHERE):
        if key.startswith(_BUFFER_DEBLOAT_PREFIX):
            raise ConfigurationError(
                f"{located(key)}'{key}': buffer debloating is not implemented in chandy. In-flight data "
                "per channel is bounded by its credits: taskmanager.network.memory.buffers-per-channel "
                "batches of chandy.network.batch-size records; lower those to shrink it "
                "(see docs/unaligned-checkpoints.md), and remove this key"
            )
        known = [k for o in options for k in (o.key, *o.deprecated_keys)]
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigurationError(f"{located(key)}unknown configuration key '{key}'{hint}")
    for option in options:
        for key in (option.key, *option.deprecated_keys):
            if not config.contains(key):
                continue
            try:
                Configuration({key: config.to_dict()[key]}).get(option)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{located(key)}{exc}") from None
