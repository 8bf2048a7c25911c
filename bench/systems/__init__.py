"""One runner per system; each runs one workload once and prints its figures as JSON.

The runner protocol
===================

A runner is a standalone script run as a subprocess with the Python of its system's
virtual environment (``bench/envs.py`` makes them under ``bench/.cache/venvs``). The
reference runners (``pyflink_runner.py``, ``bytewax_runner.py``, ``spark_ss_runner.py``)
import nothing from chandy or ``bench``: only the standard library and their system.
``chandy_runner.py`` runs in the project's environment.

Command line (every runner accepts these; a runner may add its own, such as ``--mode``)::

    python <system>_runner.py <w1|w2|w3|w4> --work-dir DIR
        [--records N] [--parallelism 2] [--checkpoint-interval-ms 1000]
        [--keys 10000] [--rate 1000] [--duration-s 20] [--value-bytes 100]

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
"""
