"""Process-wide memory allocator settings for the batch path.

The batch path allocates and frees a few arrays of a batch's size for every batch, in its
operators and in its record writer; glibc's default heap trimming makes each of them fault its
pages in again. One setting, shared by every caller, keeps that memory in the process.
"""

from __future__ import annotations

import ctypes

#: glibc's mallopt(3) parameters (malloc.h).
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: Allocations at least this large are mmapped; smaller ones (a batch's columns: 512 KiB for
#: 65,536 int64 rows) come from the heap. 32 MiB is glibc's largest on 64-bit systems
#: (``4 * 1024 * 1024 * sizeof(long)``; mallopt refuses more).
MMAP_THRESHOLD_BYTES = 32 << 20


def keep_freed_heap(pad_bytes: int = 16 << 20) -> None:
    """Ask glibc to keep ``pad_bytes`` of freed heap instead of returning it to the system.

    A batch operator allocates and frees a few arrays of a batch's size per batch; with
    glibc's defaults (128 KiB of padding) the top of the heap is trimmed after each batch and
    faulted in again page by page in the next: without this a keyed running sum over 32k-row
    batches measured 20 to 25 ns a row instead of 17.5 to 18.5 (13 instead of 11.5 with the
    batches in cache).
    Setting ``M_TOP_PAD`` also turns off glibc's dynamic mmap threshold (mallopt(3)), which
    otherwise rises to the size of the largest freed mmapped block: called before any large
    free, it left the threshold at 128 KiB and every batch-sized column was mmapped and
    unmapped (300 instead of 17 us per 512 KiB array), so the threshold is set explicitly
    (:data:`MMAP_THRESHOLD_BYTES`).
    Both are process-wide settings that only keep more memory mapped, so setting them again
    is harmless; this is a no-op outside glibc.
    """
    try:  # the process's own symbols, libc's among them (find_library would run ldconfig)
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        mallopt(M_TOP_PAD, pad_bytes)
    except (OSError, AttributeError, TypeError):  # no mallopt (macOS; Windows has no CDLL(None))
        return
