"""AMX tiles for the engine's model worker: asked of the kernel before vLLM's CPU kernels use them.

On an Intel Xeon with AMX (Sapphire Rapids and later), Linux lets a process use the AMX tile registers only once
it has asked (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a process that uses them before is killed
with SIGILL. oneDNN and PyTorch ask before their own AMX kernels; vLLM's CPU attention kernel (its ``amx`` ISA,
chosen for bfloat16 on such a CPU) does not. So a model worker whose first AMX instruction is vLLM's (a small
batch, whose GEMMs oneDNN runs without AMX) died at its first step with no traceback: vLLM's engine core saw its
worker gone ("RuntimeError: cancelled"), on an AMX Xeon only, two runs in three.

The permission is per process (inherited on fork, cleared by exec), so it is asked in the process that runs the
model: vLLM imports this module there while it builds its worker, as the engine's ``worker_extension_cls``
(``AmxTiles``, which adds nothing to the worker), whichever way the process was started (forked, spawned, a Ray
worker). Elsewhere (no AMX, not x86-64 Linux) asking is refused or skipped, and nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import sys

log = logging.getLogger(__name__)

SYS_ARCH_PRCTL = 158  # x86-64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
EXTENSION = f"{__name__}.AmxTiles"  # the engine argument ``worker_extension_cls`` (``stages.pipeline``)


def allow_amx_tiles() -> bool:
    """Ask the kernel to let this process use AMX tiles; whether it does (False where there is no AMX)."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) == 0
    except (OSError, AttributeError):  # no libc symbol to call: nothing to ask
        return False


ALLOWED = allow_amx_tiles()  # at import: in the model worker, before vLLM loads the model or runs a step
log.debug("AMX tiles %s for this process", "allowed" if ALLOWED else "not available")


class AmxTiles:
    """vLLM's worker extension whose import asks for AMX tiles in the model worker's process (see the module)."""
