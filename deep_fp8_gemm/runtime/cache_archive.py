"""Ship the JIT cubin cache to another machine: ``python -m deep_fp8_gemm cache export FILE`` / ``cache import FILE``.

The archive is a plain tar file of cache entries, ``<key>.cubin`` and ``<key>.json`` (:mod:`.cache`'s own files,
nothing else: no debug dumps, locks or simulator libraries). The key is path-independent (the include directory
enters it as a fixed token, the headers by content), so an entry built on one machine is the entry another machine
with the same package version, NVRTC and options looks up.

**Export** writes only entries the cache itself would serve: each is read through :meth:`.cache.DiskCache.load`
(the directory's ownership checks, then the metadata's format and key, the cubin's size, ELF magic and sha256).

**Import** trusts nothing in the file. The archive's members are read as data (never extracted by path): a member
that is not a regular file named ``<64 hex>.cubin`` / ``<64 hex>.json``, or larger than :data:`MAX_MEMBER_BYTES`,
is refused and named; each key needs both files, and they must pass the same verification as a cache read
(:meth:`.cache.DiskCache._intact`: format, key, size, ELF magic, sha256); only then is the entry written, through
:meth:`.cache.DiskCache.store` (the checked, owner-only directory, atomic writes). An entry already present is left
as it is. An entry is code that will run on the GPU in the user's context: import archives you built or trust, as
you would copy the cache directory itself. Entries of another NVRTC or package version import fine and are never
looked up (their keys differ); :func:`import_archive` counts them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import tarfile
from pathlib import Path

from . import cache, cachedir

#: The largest member an import reads (a GEMM cubin is ~100-300 KB, its metadata a few KB).
MAX_MEMBER_BYTES = 64 << 20
_MEMBER = re.compile(r"^([0-9a-f]{64})\.(cubin|json)$")


@dataclasses.dataclass
class ImportReport:
    """What :func:`import_archive` did: keys written, already present, from another compiler, and refusals
    (``(member or key, reason)``)."""

    imported: int = 0
    present: int = 0
    other_compiler: int = 0
    refused: list = dataclasses.field(default_factory=list)


def _entry_keys(disk: cache.DiskCache) -> list[str]:
    """Keys of the metadata files in the cache directory (sorted), read through the checked directory."""
    try:
        with cachedir.opened(disk.directory) as d:
            files = d.files(_MEMBER)
    except (FileNotFoundError, cachedir.NotADirectoryCacheError):
        return []
    return sorted(name[:-5] for name, _ in files if name.endswith(".json"))


def export_archive(path: Path, disk: cache.DiskCache | None = None) -> int:
    """Write every verified entry of ``disk`` (default the process's cache) to the tar file ``path`` (replaced);
    returns the number of entries. Damaged entries are skipped (a cache read would treat them as misses)."""
    disk = cache.disk_cache() if disk is None else disk
    count = 0
    with tarfile.open(path, "w") as tar:
        for key in _entry_keys(disk):
            entry = disk.load(key)
            if entry is None:
                continue
            meta = json.dumps(dict(entry.meta), indent=1, sort_keys=True).encode()
            for name, data in ((f"{key}.cubin", entry.cubin), (f"{key}.json", meta)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o600
                tar.addfile(info, io.BytesIO(data))
            count += 1
    return count


def import_archive(path: Path, compiler_id: str, disk: cache.DiskCache | None = None) -> ImportReport:
    """Verify and add the entries of the tar file ``path`` to ``disk`` (default the process's cache); see the module
    docstring for what is refused. ``compiler_id``: this process's compiler identity (entries of another one are
    imported and counted in ``other_compiler``: they never hit here).

    Raises:
        tarfile.TarError / OSError: not a readable tar file.
        cachedir.UnsafeCacheDirError: the cache directory fails its checks (nothing is written).
    """
    disk = cache.disk_cache() if disk is None else disk
    report = ImportReport()
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            match = _MEMBER.match(member.name)
            if match is None or not member.isreg():
                report.refused.append((member.name, "not a cache entry file (<64 hex>.cubin / .json, regular)"))
                continue
            if member.size > MAX_MEMBER_BYTES:
                report.refused.append((member.name, f"larger than {MAX_MEMBER_BYTES} bytes"))
                continue
            data = tar.extractfile(member).read(MAX_MEMBER_BYTES + 1)
            members.setdefault(match.group(1), {})[match.group(2)] = data
    for key, files in sorted(members.items()):
        if set(files) != {"cubin", "json"}:
            report.refused.append((key, f"only its .{next(iter(files))} is in the archive"))
            continue
        try:
            meta = json.loads(files["json"])
        except ValueError:
            report.refused.append((key, "metadata is not JSON"))
            continue
        if not cache.DiskCache._intact(key, meta, files["cubin"]):
            report.refused.append((key, "fails the cache's verification (format, key, size, ELF magic, sha256)"))
            continue
        if disk.load(key) is not None:
            report.present += 1
            continue
        with disk.lock(key):
            disk.store(key, files["cubin"], meta)
        report.imported += 1
        report.other_compiler += meta.get("compiler") != compiler_id
    return report
