"""``python -m deep_fp8_gemm {audit,precompile,cache,env,kinds,bench,demo}``; all of it works without a GPU.

* ``audit``: compile every distinct kernel the heuristic picks for the given shapes and M values and
  check registers, spills, local memory, required SASS and ptxas warnings, and the K-loop figures against
  their ceilings (exit 1 if any check fails; the K-loop ceilings gate only the kernels CI gates — the
  DeepSeek-V3 tables' picks — and never the watchdog build: for the others the figures are reported as notes).
* ``demo``: on an sm_90 GPU the layer's GEMMs against the reference and cuBLAS; without one, the layer's kernels
  compiled and audited, the math on the CPU reference and one call per kind in the CPU simulator.
* ``precompile``: the same kernel list, only compiled into the disk cache (for build boxes: pass the
  serving GPU's ``--num-sms``), or with ``--model deepseek-v3 --tp 8`` a model's serving set
  (:mod:`deep_fp8_gemm.kernels.serving`); ``--jobs N`` worker processes, a progress bar, the total time;
  ``--check`` lists what the cache lacks and times the warm start.
* ``cache info`` / ``cache clear``: the on-disk caches (cubins, simulator libraries, saved failing sources)
  and the result of their ownership checks; ``cache export FILE`` / ``cache import FILE``: the cubin cache as a tar
  file, verified entries only both ways (:mod:`deep_fp8_gemm.runtime.cache_archive`); ``env``: versions and paths
  the JIT uses.
* ``bench``: the benchmarks of a checkout's ``bench/`` (listed; ``bench NAME ARGS`` runs one).
* ``kinds``: the kinds table (each GEMM kind's point on the axes); ``kinds --header`` prints the C++ header generated
  from it (``include/deep_fp8_gemm/kinds.cuh``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import multiprocessing
import os
import re
import sys
import time
from collections.abc import Sequence

from .kinds import TABLE

#: The GEMM kinds (the rows of the kinds table, torch-free) and the audit's other kernel families.
GEMM_KINDS = TABLE.names_of("fp8_gemm")
ALL_KINDS = (*GEMM_KINDS, "quant", "attention", "bf16", "tf32", "mxfp4")
#: The audit's families whose kernels do not depend on the problem shape (every variant is audited). ``bf16`` / ``tf32``:
#: the BF16 GEMM and the TF32 hc-prenorm kernel families (the kinds table's bf16_* and tf32_hc_prenorm rows; run-time
#: shapes: kernels/bf16_gemm.py, kernels/hc_prenorm.py audit_configs).
SERVING_MODELS = ("deepseek-v3",)  # kernels.serving.MODELS (kept here: --help without importing torch)
SHAPELESS_KINDS = {"quant": "quant", "attention": "mqa_logits", "bf16": "bf16_gemm",
                   "tf32": "hc_prenorm", "mxfp4": "mxfp4_gemm"}  # family -> kernels module


def plain(text: str) -> str:
    """A docstring line for ``--help``: RST markup removed (````x```` and ``:func:`x``` read as ``x``)."""
    return re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")


class CliError(Exception):
    """A usage problem reported as ``error: ...`` with exit status 2."""


# ---------------------------------------------------------------------------------------- arguments
def _shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape must be N,K (two integers) or 'deepseek-v3', got {text!r}") from None
    if n <= 0 or k <= 0:
        raise argparse.ArgumentTypeError(f"shape N,K must be positive, got {text!r}")
    return n, k


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _add_kernel_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=(*ALL_KINDS, "all"), default="all", help="kernel family (default: all)")
    parser.add_argument("--shapes", nargs="+", default=None, metavar="N,K",
                        help="weight shapes N,K, or 'deepseek-v3' for the built-in table (default); the quantiser "
                             "kernels do not depend on shapes (--kind quant takes no --shapes / --m)")
    parser.add_argument("--m", action="append", type=_int_list, metavar="M,...",
                        help="M values (comma-separated, repeatable); default: the kernel family's M range")
    parser.add_argument("--num-sms", type=int, default=132, help="SM count of the target GPU (default 132, H100/H200)")
    parser.add_argument("--num-groups", type=int, default=None, help="expert count for grouped kernels")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m deep_fp8_gemm``."""
    parser = argparse.ArgumentParser(
        prog="python -m deep_fp8_gemm", description=plain(__doc__.split("\n")[0]),
        epilog="Benchmarks (a checkout's bench/ folder): python -m deep_fp8_gemm bench lists them; on a GPU, "
               "bash bench/device_check.sh OUTDIR runs the tests and the benchmarks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("audit", help="compile and statically check kernels (no GPU needed)")
    _add_kernel_selection(p)
    p.add_argument("--json", metavar="PATH", help="write the records as JSON to PATH ('-' = stdout, nothing else)")
    p.add_argument("--jobs", "-j", type=int, default=1, help="audit in N worker processes (default 1)")

    p = sub.add_parser("precompile", help="fill the JIT cache for the given shapes, or a model's serving set")
    _add_kernel_selection(p)
    p.add_argument("--model", choices=SERVING_MODELS, default=None,
                   help="instead of --kind / --shapes / --m: every kernel the model's serving can call, M 1..8192 "
                        "per rank (deep_fp8_gemm.kernels.serving; docs/cli.md)")
    p.add_argument("--tp", type=int, default=1, help="with --model: tensor-parallel ranks (experts split over them)")
    p.add_argument("--jobs", "-j", type=int, default=1, help="compile in N worker processes (default 1)")
    p.add_argument("--check", action="store_true",
                   help="compile nothing: list the kernels the cache lacks (exit 1 if any) and time reading and "
                        "verifying the ones it has (the warm start)")

    p = sub.add_parser("cache", help="inspect (with its ownership checks) or empty the on-disk caches; export / "
                                     "import the cubin cache as a tar file (verified both ways)")
    p.add_argument("action", choices=("info", "clear", "export", "import"))
    p.add_argument("file", nargs="?", help="export / import: the tar file")

    sub.add_parser("env", help="versions and paths the JIT uses")

    p = sub.add_parser("bench", help="list the benchmarks (bench/ of a checkout), or run one: bench NAME [ARGS]",
                       add_help=False)

    p = sub.add_parser("kinds", help="the GEMM kinds table: each kind's axis values")
    p.add_argument("--header", action="store_true", help="print the generated C++ header instead")

    # Listed for --help only: main() hands everything after "demo" to deep_fp8_gemm.demo untouched.
    sub.add_parser("demo", help="run the demo (deep_fp8_gemm.demo; its own options follow)", add_help=False)
    return parser


# ---------------------------------------------------------------------------------------- kernel list
def collect_targets(kind: str, shapes: Sequence[str], ms: list[int] | None, num_sms: int,
                    num_groups: int | None) -> list:
    """AuditTargets from the kernel families (imported lazily: they pull in the config heuristics)."""
    if num_sms <= 0:
        raise CliError(f"--num-sms must be positive, got {num_sms}")
    if kind in SHAPELESS_KINDS and (shapes or ms or num_groups):
        what = "quantiser" if kind == "quant" else "MQA-logits (indexer)"
        raise CliError(f"the {what} kernels do not depend on the problem shape (every variant is audited): "
                       f"--shapes, --m and --num-groups do not apply to --kind {kind}")
    parsed = None if not shapes or list(shapes) == ["deepseek-v3"] else [_shape(s) for s in shapes]
    targets = []
    for family in (ALL_KINDS if kind == "all" else (kind,)):
        if family in SHAPELESS_KINDS:
            targets += _kernel_module(SHAPELESS_KINDS[family]).audit_targets()
        else:
            targets += _kernel_module("targets").audit_targets(family, parsed, ms, num_sms, num_groups)
    return targets


def _kernel_module(name: str):
    try:
        return importlib.import_module(f"deep_fp8_gemm.kernels.{name}")
    except ImportError as exc:
        raise CliError(f"kernel family module deep_fp8_gemm.kernels.{name} is not available: {exc}") from exc


def _targets_from_args(args: argparse.Namespace) -> list:
    ms = sorted({m for chunk in args.m for m in chunk}) if args.m else None
    try:
        return collect_targets(args.kind, args.shapes, ms, args.num_sms, args.num_groups)
    except argparse.ArgumentTypeError as exc:
        raise CliError(str(exc)) from exc
    except ValueError as exc:  # a shape the kernels cannot take (n % 8, k % 16, ...): the config rule's message
        raise CliError(f"no kernel for --kind {args.kind} --shapes {' '.join(args.shapes or ['deepseek-v3'])}: "
                       f"{exc}") from exc


# ---------------------------------------------------------------------------------------- commands
def _check_json_path(path: str | None) -> None:
    """A ``--json`` file must be writable where it is named, checked before anything is compiled."""
    if path in (None, "-"):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"--json {path}: the directory {parent} does not exist")
    if os.path.isdir(path):
        raise CliError(f"--json {path} is a directory; name a file")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CliError(f"--json {path}: not writable")


def cmd_audit(args: argparse.Namespace) -> int:
    from .runtime.audit import audit_parallel, format_table

    if args.jobs <= 0:
        raise CliError(f"--jobs must be positive, got {args.jobs}")
    _check_json_path(args.json)
    records = audit_parallel(_targets_from_args(args), args.jobs, progress=True)
    if args.json == "-":
        json.dump(records, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)
        print(format_table(records))
    return 0 if all(r["ok"] for r in records) else 1


def _precompile_one(target) -> str:
    """Compiles one target into the cache; returns its cache_hit or ``"error: ..."`` (runs in workers)."""
    from .runtime.compiler import CompileError, compile_kernel

    try:
        return compile_kernel(target.name, target.source, options=target.options).cache_hit
    except CompileError as exc:
        return f"error: {exc}"


def cmd_precompile(args: argparse.Namespace) -> int:
    if args.jobs <= 0:
        raise CliError(f"--jobs must be positive, got {args.jobs}")
    start = time.perf_counter()
    pool = None
    if args.jobs > 1:
        # Processes, not threads: NVRTC's thread-safety differs between versions, and the disk cache's
        # per-key locks already make concurrent processes safe. "spawn" avoids forking torch's threads.
        pool = concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        targets = _serving_targets(args, pool) if args.model else _targets_from_args(args)
        if args.check:
            return _precompile_check(targets)
        return _precompile_targets(targets, pool, start)
    finally:
        if pool is not None:
            pool.shutdown()


def _serving_targets(args: argparse.Namespace, pool) -> list:
    """``precompile --model``: the model's serving set (``kernels.serving``), its M sweeps in the pool's workers."""
    if args.kind != "all" or args.shapes or args.m or args.num_groups:
        raise CliError("--model selects the kernels itself: --kind, --shapes, --m and --num-groups do not apply")
    if args.num_sms <= 0:
        raise CliError(f"--num-sms must be positive, got {args.num_sms}")
    from .kernels import serving

    start = time.perf_counter()
    try:
        targets = serving.serving_targets(args.model, args.tp, args.num_sms, map_fn=pool.map if pool else map)
    except ValueError as exc:
        raise CliError(f"--model {args.model} --tp {args.tp}: {exc}") from exc
    kinds = {}
    for t in targets:
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    print(f"{args.model} tp {args.tp}, {args.num_sms} SMs: {len(targets)} kernels ("
          + ", ".join(f"{kind} {n}" for kind, n in kinds.items()) + f"), selected in {time.perf_counter() - start:.1f} s",
          file=sys.stderr)
    return targets


def _precompile_targets(targets: list, pool, start: float) -> int:
    """Compile ``targets`` into the disk cache (in ``pool`` if given) with a progress bar; print the total."""
    from .runtime.audit import print_progress

    outcomes: list[str] = []

    def record(i: int, outcome: str, name: str) -> None:
        outcomes.append(outcome)
        if outcome.startswith("error: "):
            print(f"\n{outcome}", file=sys.stderr)
        print_progress(i + 1, len(targets), time.perf_counter() - start, name)

    if pool is None:
        for i, target in enumerate(targets):
            record(i, _precompile_one(target), target.name)
    else:
        for i, (target, outcome) in enumerate(zip(targets, pool.map(_precompile_one, targets))):
            record(i, outcome, target.name)
    failed = sum(o.startswith("error: ") for o in outcomes)
    new = outcomes.count("")
    print(f"precompiled {len(targets)} kernels ({new} compiled, {len(targets) - new - failed} cached, "
          f"{failed} failed) in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0


def _precompile_check(targets: list) -> int:
    """``precompile --check``: which of ``targets`` the disk cache lacks, and the warm start: its disk part (each
    cubin read and its checksum verified) and, where an sm_90 GPU is present, its driver part (each present cubin
    loaded as a boot loads it, :func:`~deep_fp8_gemm.runtime.driver.load_kernel`, and made resident)."""
    from . import env
    from .runtime.compiler import cached_kernel

    start = time.perf_counter()
    found = [(t, cached_kernel(t.name, t.source, options=t.options)) for t in targets]
    seconds = time.perf_counter() - start
    missing = [t.name for t, kernel in found if kernel is None]
    for name in missing:
        print(f"missing: {name}")
    have = len(targets) - len(missing)
    print(f"{have} of {len(targets)} kernels in {env.jit_cache_dir()} ({len(missing)} missing); warm start: "
          f"{have} cubins read and verified in {seconds:.2f} s")
    device = _sm90_device()
    if device is None:
        print("warm start, driver part: not timed (no sm_90 GPU here: loading a cubin needs the driver)")
    else:
        loaded = [kernel for _, kernel in found if kernel is not None]
        seconds = _time_driver_load(loaded, device)
        print(f"warm start, driver part: {len(loaded)} kernels loaded on GPU {device} in {seconds:.2f} s "
              f"(cuLibraryLoadData + cuLibraryGetKernel, each made resident)")
    return 1 if missing else 0


def _sm90_device() -> int | None:
    """The current CUDA device's ordinal when it is an sm_90 GPU, else None (no torch CUDA, no driver)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from .runtime import target

    index = target.current_device()
    return index if target.capability(index) == (9, 0) else None


def _time_driver_load(kernels: list, device: int) -> float:
    """Seconds to load ``kernels`` (``CompiledKernel`` entries of the disk cache) into the driver on ``device`` the way a
    first call does. With lazy loading (CUDA_MODULE_LOADING=LAZY, the default since CUDA 12.2) cuLibraryLoadData
    defers the device-side load to first use: a kernel attribute query makes each one resident, so the figure is
    the whole load a boot pays, not the lazy part of it."""
    from .runtime import driver

    start = time.perf_counter()
    for kernel in kernels:
        driver.make_resident(driver.load_kernel(kernel.cubin, kernel.name, device, key=kernel.key))
    return time.perf_counter() - start


def cmd_cache(args: argparse.Namespace) -> int:
    """``info``: the checks' result, then cubins, simulator libraries and saved failing sources (exit 1 when
    the checks fail: nothing there is read). ``clear``: empties all three (refused when the checks fail)."""
    from . import env
    from .runtime import cache, cachedir, compiler
    from .simulator import build

    directory = env.jit_cache_dir()
    if (args.file is None) != (args.action in ("info", "clear")):
        raise CliError(f"cache {args.action} " + ("takes no file" if args.file else "needs a FILE (a tar file)"))
    passed, checks = cachedir.describe(directory)
    if args.action in ("export", "import"):
        if not passed:
            raise CliError(f"not using {directory}: {checks}")
        return _cache_transfer(args.action, args.file)
    if args.action == "clear":
        if not passed:
            raise CliError(f"not clearing {directory}: {checks}")
        cubins, libraries, sources = cache.cache_clear(), build.library_cache_clear(), compiler.saved_sources_clear()
        print(f"removed {cubins} entries, {libraries} simulator libraries and {sources} saved sources from {directory}")
        return 0
    print(f"dir: {directory}\nchecks: {checks}")
    if not passed:
        return 1
    info = cache.cache_info()
    print(f"entries: {info['entries']}\nbytes: {info['bytes']}")
    for label, part in (("simulator libraries", build.library_cache_info()),
                        ("saved failing sources", compiler.saved_sources_info())):
        print(f"{label}: {part['entries']} ({part['bytes']} bytes in {part['dir']})")
    return 0


def _cache_transfer(action: str, file: str) -> int:
    """``cache export FILE`` / ``cache import FILE`` (runtime.cache_archive: verified entries only, both ways)."""
    import tarfile
    from pathlib import Path

    from . import env
    from .runtime import cache_archive, compiler

    start = time.perf_counter()
    if action == "export":
        if os.path.isdir(file) or not os.path.isdir(os.path.dirname(os.path.abspath(file))):
            raise CliError(f"cache export {file}: name a file in an existing directory")
        count = cache_archive.export_archive(Path(file))
        print(f"exported {count} entries of {env.jit_cache_dir()} to {file} ({os.path.getsize(file)} bytes) in "
              f"{time.perf_counter() - start:.2f} s")
        return 0
    try:
        report = cache_archive.import_archive(Path(file), compiler.compiler_identity())
    except (tarfile.TarError, OSError) as exc:
        raise CliError(f"cache import {file}: not a readable tar file ({exc})") from exc
    for what, why in report.refused:
        print(f"refused: {what}: {why}", file=sys.stderr)
    print(f"imported {report.imported} entries into {env.jit_cache_dir()} ({report.present} already there, "
          f"{len(report.refused)} refused) in {time.perf_counter() - start:.2f} s")
    if report.other_compiler:
        print(f"note: {report.other_compiler} imported entries were built by another compiler than "
              f"{compiler.compiler_identity()}: never looked up here", file=sys.stderr)
    return 1 if report.refused else 0


def env_report() -> dict:
    """What ``env`` prints, as a dict (each probe reports its own failure instead of raising)."""
    import platform

    from . import __version__, env

    report: dict[str, str] = {"deep_fp8_gemm": __version__,
                              "python": f"{platform.python_version()} ({platform.python_implementation()})"}
    try:
        import torch

        report["torch"] = torch.__version__
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            report["device"] = f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)"
        else:
            report["device"] = "no GPU"
    except ImportError:
        report["torch"] = "not installed"
        report["device"] = "unknown (no torch)"
    try:
        from .runtime.compiler import compiler_identity, nvrtc_version

        report["nvrtc"] = "%d.%d" % nvrtc_version()
        report["compiler id"] = compiler_identity()
    except Exception as exc:  # missing library is a finding, not a crash
        report["nvrtc"] = f"unavailable ({exc})"
    try:
        from .runtime.paths import include_dir

        report["include dir"] = str(include_dir())
    except FileNotFoundError as exc:
        report["include dir"] = f"missing ({exc})"
    report["cache dir"] = str(env.jit_cache_dir()) + (" (disabled)" if env.jit_disable_cache() else "")
    try:
        ns = env.watchdog_ns()
        report["watchdog"] = f"{ns / 1e9:g} s (DFG_WATCHDOG_SECONDS: watchdog build)" if ns else "off"
    except ValueError as exc:
        report["watchdog"] = f"invalid ({exc})"
    try:
        from .runtime.sass import find_disassembler

        report["disassembler"] = str(find_disassembler()[1])
    except RuntimeError as exc:
        report["disassembler"] = f"none ({exc})"
    return report


def cmd_env(args: argparse.Namespace) -> int:
    for key, value in env_report().items():
        print(f"{key + ':':<14}{value}")
    return 0


def cmd_kinds(args: argparse.Namespace) -> int:
    if args.header:
        sys.stdout.write(TABLE.render_header())
        return 0
    axes = [axis.name for axis in TABLE.axes]
    rows = [[row.name, *(row.point()[a] if a != "order" else ",".join(row.orders) for a in axes)]
            for row in TABLE.rows]
    widths = [max(len(x) for x in column) for column in zip(["kind", *axes], *rows)]
    for line in [["kind", *axes], *rows]:
        print("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip())
    return 0


def cmd_bench(argv: list[str]) -> int:
    """``bench``: the benchmarks of ``bench/`` (importable from a checkout or an editable install), listed with their
    first docstring line; ``bench NAME ARGS`` runs ``python -m bench.bench_NAME ARGS``."""
    import pkgutil

    try:
        bench = importlib.import_module("bench")
    except ImportError:
        raise CliError("the benchmarks live in the repository's bench/ folder, which this installation does not "
                       "have: run them from a checkout (python -m bench.bench_dense ...)") from None
    names = sorted(info.name[len("bench_"):] for info in pkgutil.iter_modules(bench.__path__)
                   if info.name.startswith("bench_"))
    if not argv or argv[0] in ("-h", "--help"):
        print("benchmarks (python -m deep_fp8_gemm bench NAME [ARGS], or python -m bench.bench_NAME [ARGS]):")
        for name in names:
            doc = importlib.import_module(f"bench.bench_{name}").__doc__ or ""
            print(f"  {name:<10} {plain(doc.strip().splitlines()[0]) if doc.strip() else ''}")
        return 0
    if argv[0] not in names:
        raise CliError(f"no benchmark {argv[0]!r}; choose one of {', '.join(names)}")
    return int(importlib.import_module(f"bench.bench_{argv[0]}").main(argv[1:]) or 0)


def cmd_demo(demo_argv: list[str]) -> int:
    try:
        demo = importlib.import_module("deep_fp8_gemm.demo")
    except ImportError as exc:
        raise CliError(f"the demo is not available: {exc}") from exc
    return int(demo.main(demo_argv) or 0)


_COMMANDS = {"audit": cmd_audit, "precompile": cmd_precompile, "cache": cmd_cache, "env": cmd_env, "kinds": cmd_kinds}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status (0 ok, 1 a kernel failed, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["demo"]:  # the demo parses its own options
            return cmd_demo(argv[1:])
        if argv[:1] == ["bench"]:  # so does each benchmark
            return cmd_bench(argv[1:])
        # argparse reads a token starting with "-" as an option unless it is a plain negative number: give a
        # negative shape or M list ("-128,256") a leading space, so that it reaches its own value check.
        argv = [" " + a if "," in a and re.fullmatch(r"-\d[\d,-]*", a) else a for a in argv]
        args = build_parser().parse_args(argv)
        return _COMMANDS[args.command](args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
