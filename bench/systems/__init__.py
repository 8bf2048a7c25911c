"""One runner per system; each runs one workload once and prints its figures as JSON.

The runner protocol
===================

A runner is a standalone script run as a subprocess with the Python of its system's
virtual environment (``bench/envs.py`` makes them under ``bench/.cache/venvs``). The
reference runners (``pyflink_runner.py``, ``bytewax_runner.py``, ``spark_ss_runner.py``)
import nothing from chandy or ``bench``: only the standard library, their system, and
``w5_events.py``, ``w4r_records.py`` and ``w6_records.py`` beside them (standard library
only: a workload's records, pacing, checks and figures, defined once so that every system
does the same work and is held to the same results). ``chandy_runner.py`` runs in the project's environment.

Two more runners are anchors, systems that run no Python per record, for W1 and W5
(Flink SQL also W3; the other workloads answer ``"ok": false``, "not implemented"):
``flink_sql_runner.py`` (Flink's JVM engine through SQL, in PyFlink's environment, whose
runner's JVM and process handling it reuses) and ``pathway_runner.py`` (Pathway's Rust
engine, in its own). Both time three jobs in one process and report, beside
``records_per_s``, ``steady_records_per_s`` (``steady.py``, standard library only: the
rate with start-up, submission and JIT warm-up left out), and check W1's sums and W5's
window sums on small N.

Command line (every runner accepts these; a runner may add its own, such as ``--mode``)::

    python <system>_runner.py <w1|w2|w3|w4|w4r|w5|w6|w1v|w3v> --work-dir DIR
        [--records N] [--parallelism 2] [--checkpoint-interval-ms 1000]
        [--keys 10000] [--rate 1000] [--duration-s 20] [--value-bytes 100]
        [--per-event-second 100000] [--update-fraction 0.01] [--update-s 20]

``--checkpoint-interval-ms 0`` turns checkpoints (commits, snapshots) off.
``--work-dir`` is an empty directory of the runner's own (checkpoints, marker files).

Output: logs go to stderr; the **last line of stdout** is one JSON object::

    {"system": "pyflink", "variant": "thread", "workload": "w1", "ok": true, ...figures}

or, when the system cannot do the workload or failed, ``"ok": false`` with ``"error"``:
one line saying why (the exception's type and message). The exit code is 0 either way
unless the runner itself crashed.

Workloads (same source semantics for every system)
--------------------------------------------------

* **w1** keyed running count: the ints ``0..N-1`` as fast as the system reads them,
  key ``i % keys``, a keyed ValueState holding the sum of the key's values, updated
  and emitted for every record, a sink that discards records but notes the wall-clock
  time of the first and the last. Figures: ``records``, ``records_per_s`` (N / time
  from the first record to the last at the sink, start-up excluded), ``first_to_last_s``,
  ``wall_s`` (the whole run, start-up included), ``checkpoints_completed``,
  ``checkpoint_p50_ms``, ``checkpoint_max_ms`` (``null`` without checkpoints).
* **w2** exactly-once under failure: w1 bounded at N, with one failure injected once
  (a raised exception in the keyed function at record ``N // 2``, on the first attempt
  only, with a marker file in the work dir), after at least one checkpoint completed.
  Figures: ``exact`` (every key's final sum equals ``sum(i for i in range(N) if
  i % keys == k)``), ``wrong_keys`` (how many differ or are missing), ``recovery_s``
  (the wall-clock time from the raise to the first record the keyed function
  processes after the restore), ``wall_s``.
* **w3** latency: ``rate`` records per second for ``duration_s`` seconds, each carrying
  ``time.time()`` taken when the source emits it, through the same keyed ValueState
  sum; the sink computes ``time.time() - stamp``. Checkpoints on. Figures:
  ``latency_p50_ms``, ``latency_p99_ms``, ``latency_max_ms``, ``records`` (measured,
  after dropping the first second as warm-up).
* **w4** state size: ``records`` (default 1,000,000) distinct keys, each with a value of
  ``value_bytes`` bytes, stored in a keyed ValueState; once every record is in, one
  checkpoint is taken. Figures: ``keys``, ``checkpoint_duration_ms`` and
  ``checkpoint_size_bytes`` of the first checkpoint that covers every record.
* **w4r** W4 on RocksDB (``w4r_records``, standard library only, like ``w5_events``):
  ``records`` keys (10 M in the full comparison) with ``value_bytes``-byte values loaded into
  a keyed ValueState as fast as the system reads them, then ``update_fraction`` of the keys
  (1 %) updated per second for ``update_s`` seconds, checkpoints every second, on each
  system's RocksDB state with incremental checkpoints (chandy ``state.backend.type:
  rocksdb`` + ``execution.checkpointing.incremental``; PyFlink EmbeddedRocksDBStateBackend,
  incremental; Spark RocksDBStateStoreProvider with changelog checkpointing). Figures
  (``w4r_records.figures``, over the checkpoints of the steady update phase):
  ``checkpoint_p50_ms``, ``checkpoint_max_ms``, ``uploaded_p50_bytes``,
  ``uploaded_mean_bytes``, ``uploaded_max_bytes`` (what a checkpoint wrote),
  ``full_size_bytes``, ``uploaded_fraction_p50``, ``load_records_per_s``,
  ``update_records_per_s``, ``keys`` and the measured checkpoints themselves
  (``steady_checkpoints``).
* **w5** keyed tumbling event-time window: the events of ``w5_events.W5Events``
  (record ``i`` = ``(i % keys, i, timestamp)``, ``per_event_second`` records per second of
  event time, out of order by up to 100 ms; ``records`` a multiple of it), timestamps
  from the records and watermarks 200 ms behind the largest (bounded out-of-orderness),
  1 s tumbling event-time windows per key, the sum of the values, a sink that checks
  every result (``w5_events.ResultCheck``). Checkpoints every second. Figures
  (``w5_events.figures``): ``records_per_s`` (records over the time from the first
  record a source read to the last result at a sink), ``exact`` (every (key, window)
  sum arrived once and exact; a run that is not exact fails), ``latency_p50_ms``,
  ``latency_p99_ms``, ``latency_max_ms`` (per result: its arrival at the sink minus the
  moment the sources' largest timestamps let the watermark pass its window's end; see
  ``w5_events``), ``windows``, the checkpoint figures.
* **w6** checkpoints under backpressure (``w6_records``): w1's job between a source paced
  to ``rate`` records/s (over every subtask, on a schedule that never forgives what
  backpressure held back) and a sink chained to the keyed function that sleeps to hold
  half of it, ``rate / 2 * duration_s`` records, checkpoints every second. Only chandy
  (``--mode spark`` aligned, ``--mode unaligned``) and PyFlink (``--mode thread`` aligned,
  ``--mode unaligned``) run it. Figures (``w6_records.figures``, over the checkpoints
  triggered while the sources were held back): ``checkpoint_p50_ms``,
  ``checkpoint_p99_ms``, ``checkpoint_max_ms``, ``checkpoints_under_backpressure``,
  ``unaligned_checkpoints`` and ``persisted_p50_bytes`` / ``persisted_max_bytes`` (from
  the system's checkpoint statistics; ``null`` where it does not report them),
  ``records_per_s`` at the sinks, ``source_behind_s``, ``checkpoints_completed``, each
  measured checkpoint (``checkpoints``), and the settings that bound the backlog in flight
  (chandy ``buffers_per_channel`` and ``batch_size``; PyFlink ``network_buffers``).
* **w1v**, **w3v** w1 and w3 on chandy's batch path (Arrow record batches, columnar keyed
  state): only ``chandy_runner.py`` runs them (``suite.CHANDY_ONLY_WORKLOADS``; the suite never
  asks a reference runner for them, as it never asks Spark or Bytewax for w6), with w1's and
  w3's figures plus ``arrow_batch_size``. The references' side of the comparison is their w1
  and w3.
"""
