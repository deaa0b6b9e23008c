"""JIT cubin cache: an in-process dict, then a directory on disk.

On disk (:func:`.cachedir.cache_root`, flat) each entry is two files named by its key:

* ``<key>.cubin`` — the ELF image, written first;
* ``<key>.json``  — metadata (kernel name, ptxas log, resources, sha256 and size of the cubin, compile
  time), written last, so a metadata file only ever exists next to the cubin it describes.

Both are written to a temporary file in the same directory and ``os.replace``-d into place (atomic on
POSIX). Loading parses JSON only (nothing is ``eval``-ed or unpickled) and verifies the checksum, the size
and the ELF magic; a damaged entry is treated as a miss, deleted under the key's lock and rebuilt.
Processes compiling the same key serialise on ``<key>.lock`` (``fcntl.flock``): the first compiles, the
others then find its entry. ``DFG_JIT_DEBUG`` dumps (``<key>.cu``, ``.ptx``, ``.sass``) live beside them.

Every file is read and written through :mod:`.cachedir`: the directory is checked once per process (owned
by the user or root, writable by nobody else, ancestors included) and owner-only, and entries are opened
relative to its descriptor without following links. That check is the security control; the checksum only
guards against corruption, since whoever could write a cubin could write its metadata too. The verified
bytes are the ones handed to the driver.

The key covers everything that changes the binary: the rendered source, every header under
:func:`.paths.include_dir` (kernels include only our own, toolkit-free headers), the compiler identity and
version, the options, the target and :data:`FORMAT_VERSION`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from . import cachedir
from .paths import header_files, include_dir

# Bump when the entry layout or the metadata schema changes: old entries then simply miss.
FORMAT_VERSION = 1
ELF_MAGIC = b"\x7fELF"
# Entries, dumps and locks, and the temporaries of interrupted writes: what info and clear count as the cache's.
_CACHE_FILE = re.compile(r"^([0-9a-f]{64}\.(cubin|json|lock|cu|ptx|sass)|\.[0-9a-f]{64}\.\w+\..*\.tmp)$")


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
    """The on-disk cache in one directory (created on first write, owner-only; checked on first use in a
    process, see :mod:`.cachedir`)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, key: str, suffix: str) -> Path:
        """``<directory>/<key>.<suffix>``."""
        return self.directory / f"{key}.{suffix}"

    def load(self, key: str, *, repair: bool = False) -> DiskEntry | None:
        """The entry for ``key`` if present and intact, else None.

        With ``repair`` (call it only while holding :meth:`lock`), a damaged entry is deleted.

        Raises:
            UnsafeCacheDirError: the directory fails the checks of :mod:`.cachedir`.
        """
        try:
            with cachedir.opened(self.directory) as d:
                meta = json.loads(d.read(f"{key}.json"))
                cubin = d.read(f"{key}.cubin")
        except (FileNotFoundError, cachedir.NotADirectoryCacheError):  # nothing there (lock() says why if it matters)
            return None
        # Unreadable, a link, not a file of the user's (or root's) alone, truncated or non-UTF-8 / non-JSON metadata.
        except (OSError, ValueError):
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
        with cachedir.opened(self.directory, create=True) as d:
            d.write_atomic(f"{key}.cubin", cubin)
            d.write_atomic(f"{key}.json", json.dumps(record, indent=1, sort_keys=True).encode())

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Writes ``data`` as ``path`` (a file of this directory): a 0o600 temporary file beside it, fsynced,
        then renamed over it."""
        with cachedir.opened(self.directory, create=True) as d:
            d.write_atomic(path.name, data)

    def remove(self, key: str) -> None:
        """Deletes the entry's metadata (first: it vouches for the cubin), cubin and debug dumps."""
        with contextlib.suppress(FileNotFoundError), cachedir.opened(self.directory) as d:
            for suffix in ("json", "cubin", "cu", "ptx", "sass"):
                d.unlink(f"{key}.{suffix}")

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """Exclusive inter-process lock for ``key`` (blocks); see :meth:`.cachedir.OpenDir.lock`."""
        with cachedir.opened(self.directory, create=True) as d, d.lock(f"{key}.lock"):
            yield

    def info(self) -> dict:
        """``{"dir", "entries", "bytes"}``: entries = metadata files; bytes = all cache files."""
        return cachedir.tally(self.directory, _CACHE_FILE, ".json")

    def clear(self) -> int:
        """Deletes every cache file (entries, dumps, locks, stale temporaries); returns entries removed.
        Files in the directory that the cache did not create are left alone."""
        return cachedir.clear(self.directory, _CACHE_FILE, ".json")


def disk_cache() -> DiskCache:
    """The disk cache at :func:`.cachedir.cache_root` (``DFG_JIT_CACHE_DIR``, read on each call)."""
    return DiskCache(cachedir.cache_root())


def cache_info() -> dict:
    """``{"dir": str, "entries": int, "bytes": int}`` of the disk cache."""
    return disk_cache().info()


def cache_clear() -> int:
    """Empties the disk cache and the in-process cache; returns the number of disk entries removed."""
    clear_memory_cache()
    return disk_cache().clear()
