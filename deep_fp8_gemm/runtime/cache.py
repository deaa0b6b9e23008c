"""JIT cubin cache: an in-process dict, then a directory on disk.

On disk (``env.jit_cache_dir()``, flat) each entry is two files named by its key:

* ``<key>.cubin`` — the ELF image, written first;
* ``<key>.json``  — metadata (kernel name, ptxas log, resources, sha256 and size of the cubin, compile
  time), written last, so a metadata file only ever exists next to the cubin it describes.

Both are written to a temporary file in the same directory and ``os.replace``-d into place (atomic on
POSIX). Loading parses JSON only (nothing is ``eval``-ed or unpickled) and verifies the checksum, the size
and the ELF magic; a damaged entry is treated as a miss, deleted under the key's lock and rebuilt.
Processes compiling the same key serialise on ``<key>.lock`` (``fcntl.flock``): the first compiles, the
others then find its entry. ``DFG_JIT_DEBUG`` dumps (``<key>.cu``, ``.ptx``, ``.sass``) live beside them.

The key covers everything that changes the binary: the rendered source, every header under
:func:`.paths.include_dir` (kernels include only our own, toolkit-free headers), the compiler identity and
version, the options, the target and :data:`FORMAT_VERSION`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from .. import env
from .paths import header_files, include_dir

# Bump when the entry layout or the metadata schema changes: old entries then simply miss.
FORMAT_VERSION = 1
ELF_MAGIC = b"\x7fELF"
_ENTRY_FILE = re.compile(r"^[0-9a-f]{64}\.(cubin|json|lock|cu|ptx|sass)$")
_TEMP_FILE = re.compile(r"^\.[0-9a-f]{64}\.\w+\..*\.tmp$")


# ---------------------------------------------------------------------------------------- key
@functools.lru_cache(maxsize=None)
def _digest_tree(root: Path) -> str:
    h = hashlib.sha256()
    for path in header_files(root):
        # Relative path and length framing: renaming or splitting a header changes the digest too.
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def headers_digest(root: Path | None = None) -> str:
    """sha256 over every header under ``root`` (default :func:`.paths.include_dir`); computed once per
    process and directory (headers do not change under a running process)."""
    return _digest_tree(include_dir() if root is None else root)


def cache_key(
    source: str,
    options: Sequence[str],
    arch: str,
    *,
    compiler_id: str,
    header_digest: str | None = None,
) -> str:
    """Hex sha256 naming a cache entry.

    Args:
        source: the rendered translation unit.
        options: compiler options as passed (machine-specific paths such as ``-I`` already normalised).
        arch: target, e.g. ``"sm_90a"``.
        compiler_id: compiler identity and version (:func:`.compiler.compiler_identity`).
        header_digest: digest of the include tree; default :func:`headers_digest` of ``include_dir()``.
    """
    digest = headers_digest() if header_digest is None else header_digest
    fields = [f"format={FORMAT_VERSION}", f"compiler={compiler_id}", f"arch={arch}", f"headers={digest}"]
    fields += [f"option={option}" for option in options]
    h = hashlib.sha256()
    for field in fields:
        h.update(field.encode() + b"\0")
    h.update(source.encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- memory
_MEMORY: dict = {}


def memory_get(key: object) -> object | None:
    """The in-process entry for ``key`` (any hashable), or None."""
    return _MEMORY.get(key)


def memory_put(key: object, value: object) -> None:
    """Stores an in-process entry."""
    _MEMORY[key] = value


def clear_memory_cache() -> None:
    """Forgets every in-process entry (the disk cache is untouched)."""
    _MEMORY.clear()


# ---------------------------------------------------------------------------------------- disk
@dataclasses.dataclass(frozen=True)
class DiskEntry:
    """A verified on-disk entry: the cubin bytes and its metadata dict."""

    cubin: bytes
    meta: dict


class DiskCache:
    """The on-disk cache in one directory (created on first write)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, key: str, suffix: str) -> Path:
        """``<directory>/<key>.<suffix>``."""
        return self.directory / f"{key}.{suffix}"

    def load(self, key: str, *, repair: bool = False) -> DiskEntry | None:
        """The entry for ``key`` if present and intact, else None.

        With ``repair`` (call it only while holding :meth:`lock`), a damaged entry is deleted.
        """
        try:
            meta = json.loads(self.path(key, "json").read_text())
            cubin = self.path(key, "cubin").read_bytes()
        except FileNotFoundError:
            return None
        except (OSError, ValueError):  # unreadable, truncated or non-UTF-8 / non-JSON metadata
            meta, cubin = None, b""
        if meta is not None and self._intact(key, meta, cubin):
            return DiskEntry(cubin, meta)
        if repair:
            self.remove(key)
        return None

    @staticmethod
    def _intact(key: str, meta: object, cubin: bytes) -> bool:
        return (
            isinstance(meta, dict)
            and meta.get("format") == FORMAT_VERSION
            and meta.get("key") == key
            and meta.get("cubin_bytes") == len(cubin)
            and cubin.startswith(ELF_MAGIC)
            and meta.get("cubin_sha256") == hashlib.sha256(cubin).hexdigest()
        )

    def store(self, key: str, cubin: bytes, meta: dict) -> None:
        """Writes ``<key>.cubin`` then ``<key>.json`` (with format, key, size and checksum added)."""
        record = dict(meta, format=FORMAT_VERSION, key=key, cubin_bytes=len(cubin),
                      cubin_sha256=hashlib.sha256(cubin).hexdigest())
        self.write_atomic(self.path(key, "cubin"), cubin)
        self.write_atomic(self.path(key, "json"), json.dumps(record, indent=1, sort_keys=True).encode())

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Writes ``data`` to a temporary file beside ``path``, fsyncs it, then renames it over ``path``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the rename must not reach the disk before the data
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def remove(self, key: str) -> None:
        """Deletes the entry's metadata (first: it vouches for the cubin), cubin and debug dumps."""
        for suffix in ("json", "cubin", "cu", "ptx", "sass"):
            with contextlib.suppress(FileNotFoundError):
                self.path(key, suffix).unlink()

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive inter-process lock for ``key`` (blocks). Lock files are left in place: deleting one
        while another process waits on it would let a third process lock a fresh file concurrently."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.path(key, "lock"), "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _files(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return [p for p in self.directory.iterdir()
                if p.is_file() and (_ENTRY_FILE.match(p.name) or _TEMP_FILE.match(p.name))]

    def info(self) -> dict:
        """``{"dir", "entries", "bytes"}``: entries = metadata files; bytes = all cache files."""
        files = self._files()
        return {
            "dir": str(self.directory),
            "entries": sum(1 for p in files if p.suffix == ".json"),
            "bytes": sum(p.stat().st_size for p in files),
        }

    def clear(self) -> int:
        """Deletes every cache file (entries, dumps, locks, stale temporaries); returns entries removed.
        Files in the directory that the cache did not create are left alone."""
        files = self._files()
        removed = sum(1 for p in files if p.suffix == ".json")
        for p in sorted(files, key=lambda p: p.suffix != ".json"):  # metadata first
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        return removed


def disk_cache() -> DiskCache:
    """The disk cache at the current ``DFG_JIT_CACHE_DIR`` (read on each call)."""
    return DiskCache(env.jit_cache_dir())


def cache_info() -> dict:
    """``{"dir": str, "entries": int, "bytes": int}`` of the disk cache."""
    return disk_cache().info()


def cache_clear() -> int:
    """Empties the disk cache and the in-process cache; returns the number of disk entries removed."""
    clear_memory_cache()
    return disk_cache().clear()
