"""Back the process's large, resident anonymous memory (model weights above all) with 2 MiB pages.

A decode step of an onnxruntime CPU model streams every weight once: for a 100M-parameter model that is 400 MB a
token, through 100k 4 KiB pages. With the kernel's transparent huge pages in "madvise" mode (the common default),
onnxruntime's weight buffers stay on 4 KiB pages, and how they land depends on the order sessions were created:
measured here on a random-weight 100M Llama, one thread, three sessions of the same model in one process, a step
took 25.5, 23.3 and 22.2 ms depending on which session ran it; after collapsing their memory into huge pages it took
20.1, 19.9 and 20.1 ms. ``collapse()`` asks for that with madvise(MADV_HUGEPAGE) and, on Linux 6.1 or newer,
madvise(MADV_COLLAPSE), which builds the huge pages at once instead of waiting for khugepaged.

Only anonymous read-write mappings of at least 2 MiB that are at least half resident are touched, so a large
reservation that is mostly untouched (an arena, a KV buffer not yet used) does not grow the resident set. The call
changes which pages back the memory, never its contents.

Both act on the whole process (glibc's allocator settings, every large mapping), so nothing here runs unless asked:
``load_model(..., huge_pages=True)`` or ``Generator(..., huge_pages=True)`` in the Python API, and ``decoctl
generate`` / ``decoctl bench`` by default (``--no-huge-pages`` turns them off there). ``DECOCTL_HUGE_PAGES=0``
turns them off even where asked.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from decoctl.logs import get_logger

__all__ = ["HugePageReport", "collapse", "contiguous_allocations", "enabled"]

log = get_logger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
MIN_RESIDENT_FRACTION = 0.5
# glibc's mallopt parameter, its largest accepted value on 64-bit, and its starting value
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20
MMAP_THRESHOLD_DEFAULT = 128 << 10


@attrs.frozen(kw_only=True)
class HugePageReport:
    """What one collapse() did: bytes now on huge pages, regions it could not collapse, seconds it took."""

    collapsed_bytes: int
    failed_regions: int
    seconds: float


def enabled() -> bool:
    """Whether the platform has the calls (Linux) and the environment does not turn them off."""
    return sys.platform.startswith("linux") and os.environ.get("DECOCTL_HUGE_PAGES", "1") not in ("0", "")


@contextmanager
def contiguous_allocations() -> Iterator[None]:
    """While a session loads, serve allocations up to 32 MiB from the heap rather than one mmap each.

    onnxruntime prepacks every weight matrix into its own buffer; glibc gives each buffer over 128 KiB a
    mapping of its own, and a mapping under 2 MiB can never hold a huge page, so on a small model most of the
    weights stayed on 4 KiB pages whatever collapse() did. From the heap they form one region collapse() can
    back with 2 MiB pages. Afterwards the threshold goes back to glibc's starting 128 KiB (it no longer adapts,
    which glibc's own mallopt documentation describes for any explicit setting). A no-op where huge pages are
    off or the C library has no mallopt (not glibc)."""
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None) if enabled() else None
    if mallopt is None or mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) != 1:
        yield
        return
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_DEFAULT)


def collapse() -> HugePageReport | None:
    """Collapse the process's large resident anonymous mappings into huge pages; None where not applicable
    (not Linux, turned off, or /proc/self/smaps unreadable)."""
    if not enabled():
        return None
    try:
        regions = _resident_anonymous_regions()
    except OSError:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    started = time.perf_counter()
    collapsed = failed = 0
    for start, end in regions:
        first = -(-start // HUGE_PAGE) * HUGE_PAGE
        last = end // HUGE_PAGE * HUGE_PAGE
        if last <= first:
            continue
        libc.madvise(first, last - first, MADV_HUGEPAGE)
        if libc.madvise(first, last - first, MADV_COLLAPSE) == 0:
            collapsed += last - first
        else:
            failed += 1
    report = HugePageReport(collapsed_bytes=collapsed, failed_regions=failed, seconds=time.perf_counter() - started)
    log.debug(
        "decoctl.huge_pages",
        collapsed_mib=collapsed >> 20,
        failed_regions=failed,
        seconds=round(report.seconds, 3),
    )
    return report


def _resident_anonymous_regions() -> list[tuple[int, int]]:
    """(start, end) of anonymous rw mappings >= 2 MiB with at least half their bytes resident."""
    regions: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=6)
            if "-" in head[0] and len(head) >= 5:  # a mapping's header line: range perms offset dev inode [path]
                start, end = (int(x, 16) for x in head[0].split("-"))
                path = head[5].strip() if len(head) > 5 else ""
                anonymous = path in ("", "[heap]") and head[4] == "0"
                current = (start, end) if anonymous and "rw" in head[1] and end - start >= HUGE_PAGE else None
            elif current is not None and head[0] == "Rss:":
                if int(head[1]) * 1024 >= MIN_RESIDENT_FRACTION * (current[1] - current[0]):
                    regions.append(current)
                current = None
    return regions
