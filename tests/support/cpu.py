"""What CPU a test ran on, for a failure message: engine tests have been red on one CPU of a machine kind and
green on the next (AMX Xeon vs AVX-512 EPYC), and a red run must say where it was red."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# the instruction sets that change how torch and vLLM compute on a CPU
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")


def cpu_summary(cpuinfo: str | None = None) -> str:
    """``model name; flags: ...; native bf16: yes|no`` from ``/proc/cpuinfo`` (its text, when given)."""
    from icebatch_job.process.runtime import cpu_has_native_bf16

    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "CPU unknown (no /proc/cpuinfo)"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", fields.get("Features", "")).split())
    present = [f for f in FLAGS if f in flags] or ["none of " + ", ".join(FLAGS)]
    native = "yes" if cpu_has_native_bf16(cpuinfo) else "no"
    return f"{fields.get('model name', 'CPU model unknown')}; flags: {' '.join(present)}; native bf16: {native}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test says on which CPU it failed (a conftest that imports this hook turns it on)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed:
        report.sections.append(("CPU", cpu_summary()))
