"""How the Kiln process takes memory from the system and gives it back.

A fetch answer or a produced batch is a buffer of megabytes. glibc's malloc serves such a
buffer from its heap once its mmap threshold has risen (it rises, up to 32 MiB, every time
a large mmapped buffer is freed), and memory freed inside the heap mostly stays with the
process: after clients that held hundreds of megabytes leave, the resident size stays high.
Fixing the threshold at 1 MiB keeps every buffer at least that large in its own mapping,
returned to the system the moment it is freed. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_THRESHOLD_BYTES = 128 * 1024


def return_large_buffers_to_the_system() -> bool:
    """True when glibc's malloc was told to; False where it cannot be."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, _THRESHOLD_BYTES))
    if not done:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return done
