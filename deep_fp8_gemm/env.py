"""Every ``DFG_*`` environment variable, read here and nowhere else.

Values are read on each call (an ``os.environ`` lookup, well under a microsecond), so tests and
long-running processes can change them. docs/configuration.md's "Environment variables" table mirrors this module
(``tests/test_docs.py`` checks the variables and their defaults).
"""

from __future__ import annotations

import os
from pathlib import Path



def _flag(name: str) -> bool:
    """A switch: ``1`` on; ``0``, empty or unset off. Anything else is a ``ValueError`` naming the variable (a
    typo, or ``yes`` / ``true`` / ``off``, must not silently pick a mode)."""
    value = os.environ.get(name, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ValueError(f"{name} must be 1 (on) or 0 / empty / unset (off), got {name}={value!r}")


def jit_cache_dir() -> Path:
    """``DFG_JIT_CACHE_DIR``: the on-disk caches (cubins; ``sim/`` simulator libraries; ``errors/`` sources
    that failed to compile); default ``$XDG_CACHE_HOME/deep_fp8_gemm`` (``~/.cache``). Checked before use:
    see :mod:`.runtime.cachedir`."""
    explicit = os.environ.get("DFG_JIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deep_fp8_gemm"


def jit_cache_dir_is_explicit() -> bool:
    """Whether ``DFG_JIT_CACHE_DIR`` is set: a directory there that fails the ownership checks is an error,
    while the default location falls back to a private cache."""
    return bool(os.environ.get("DFG_JIT_CACHE_DIR"))


def jit_disable_cache() -> bool:
    """``DFG_JIT_DISABLE_CACHE=1``: never read or write the on-disk cache (the in-memory cache stays on)."""
    return _flag("DFG_JIT_DISABLE_CACHE")


def jit_debug() -> bool:
    """``DFG_JIT_DEBUG=1``: dump rendered source / PTX / SASS next to the cache entry and print compile
    times and chosen configs to stderr."""
    return _flag("DFG_JIT_DEBUG")


def jit_ptxas_verbose() -> bool:
    """``DFG_JIT_PTXAS_VERBOSE=1``: print the full ptxas report of every compile to stderr."""
    return _flag("DFG_JIT_PTXAS_VERBOSE")


def simulate() -> bool:
    """``DFG_SIMULATE=1``: public ops on CPU tensors run the real kernels through the CPU simulator
    instead of the plain reference implementation."""
    return _flag("DFG_SIMULATE")


def pdl() -> bool:
    """``DFG_PDL=1``: the initial value of :func:`deep_fp8_gemm.set_pdl` (read once, at import): every kernel then
    launches as a programmatic dependent launch (it may start while the previous kernel of the stream finishes;
    each kernel waits with ``griddepcontrol.wait`` before touching memory that kernel may write)."""
    return _flag("DFG_PDL")


def as_deep_gemm() -> bool:
    """``DFG_AS_DEEP_GEMM=1``: serve the module ``deep_gemm`` from :mod:`deep_fp8_gemm.compat.deep_gemm` (the
    drop-in's import hook). The hook itself (``deep_fp8_gemm_dropin``, run from a ``.pth`` file at interpreter
    start) reads the variable with the same rule without importing this package (which imports torch); this
    function is the rule's one definition for everything inside the package."""
    return _flag("DFG_AS_DEEP_GEMM")


def deep_gemm_debug() -> bool:
    """``DFG_DEEP_GEMM_DEBUG=1``: the ``deep_gemm`` facade logs to stderr which provider serves each name the first
    time it is looked up, each knob it applies to the forwarded provider, and each call it hands to that provider
    (logger ``deep_fp8_gemm.deep_gemm`` at DEBUG; without the variable the logger is left as configured)."""
    return _flag("DFG_DEEP_GEMM_DEBUG")


def check_layouts() -> bool:
    """``DFG_CHECK_LAYOUTS=1``: the grouped GEMMs on CUDA tensors check their layout's values on every call (the
    contiguous ``m_indices`` blocks, the psum group ends, the masked counts), as every CPU call does. A debug
    switch: each check reads the layout back, so it synchronises the host with the GPU once per call (never during
    CUDA-graph capture, where it is skipped). Read when a call's signature is first seen (its plan is made) and
    on every call of the general path."""
    return _flag("DFG_CHECK_LAYOUTS")


def sim_num_sms() -> int:
    """``DFG_SIM_NUM_SMS``: SM count the simulator's persistent grid uses (default 4)."""
    value = os.environ.get("DFG_SIM_NUM_SMS", "4")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"DFG_SIM_NUM_SMS must be a positive integer, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"DFG_SIM_NUM_SMS must be a positive integer, got {n}")
    return n


def watchdog_ns() -> int:
    """``DFG_WATCHDOG_SECONDS=N`` (N > 0, may be fractional): the watchdog build. Every JIT kernel is compiled
    with ``-DDFG_WATCHDOG_NS=<N s in ns>`` (a separate binary and cache entry): an mbarrier wait that lasts
    longer prints the kernel, block, thread, barrier (full/empty + stage) and parity, then traps. Unset, empty
    or 0: the plain build (0 is returned)."""
    seconds = _seconds("DFG_WATCHDOG_SECONDS", 0.0, lambda s: 0 <= s < 2**63 / 1e9, ">= 0 seconds")
    return int(seconds * 1e9)


def _seconds(name: str, default: float, valid, rule: str) -> float:
    """The float number of seconds in variable ``name`` (``default`` when unset or empty); ``ValueError`` naming it
    for a non-number, NaN, or a value ``valid`` refuses (``rule`` says what is valid)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if seconds != seconds or not valid(seconds):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return seconds


def sim_seed() -> int:
    """``DFG_SIM_SEED``: the simulator's schedule (default 0, round-robin; any other value picks a seeded
    adversarial schedule). Set it to the seed a failing simulator test printed to reproduce that run."""
    value = os.environ.get("DFG_SIM_SEED", "0").strip() or "0"
    try:
        n = int(value, 0)
    except ValueError:
        raise ValueError(f"DFG_SIM_SEED must be a non-negative integer, got {value!r}") from None
    if not 0 <= n < 2**64:
        raise ValueError(f"DFG_SIM_SEED must be in [0, 2**64), got {n}")
    return n


def sim_races() -> str:
    """``DFG_SIM_RACES``: the simulator's race detector (happens-before checks of plain and atomic accesses to
    shared and global memory, ``hal/sim/hb.hpp``). ``1`` (default): on in every simulated launch; ``0``: off
    (its shadow memory costs ~24 bytes per byte the kernels touch with plain accesses, which large
    ``DFG_SIMULATE`` runs may not want); ``full``: on, and ``tests/kernels/test_sim_races.py``'s sweep of the real kernel
    families runs the long seed list and the larger shapes instead of CI's selection, and
    ``tests/kernels/test_sim_exact_configs.py`` runs all of its exact binaries with the detector on (otherwise one dense
    binary per tile template, with the detector off). Returns ``"on"``, ``"off"`` or ``"full"``.

    Raises:
        ValueError: another value.
    """
    value = os.environ.get("DFG_SIM_RACES", "").strip()
    if value == "full":
        return "full"
    if value in ("", "1"):
        return "on"
    if value == "0":
        return "off"
    raise ValueError(f"DFG_SIM_RACES must be 1 (on, the default), 0 (off) or full, got DFG_SIM_RACES={value!r}")


def sim_timeout_seconds() -> float:
    """``DFG_SIM_TIMEOUT_SECONDS`` (default 600): wall-clock bound of one simulated launch. A deadlock is reported
    as soon as no thread can make progress, whatever this is; the bound only stops a livelock, so it is generous:
    a big simulated GEMM on a loaded 2-core machine takes over a minute."""
    return _seconds("DFG_SIM_TIMEOUT_SECONDS", 600.0, lambda s: s > 0, "> 0")


def sim_exact_mma() -> bool:
    """``DFG_SIM_EXACT_MMA=1``: simulated wgmma accumulates in exact fp32 instead of the model of the
    Hopper FP8 tensor core (13 mantissa bits, truncation)."""
    return _flag("DFG_SIM_EXACT_MMA")
