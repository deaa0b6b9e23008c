"""Cache directories: owner-only, checked before use, read and written through a held descriptor.

Both caches hold code the process runs: cubins (:mod:`.cache`) run on the GPU in the user's context, with
access to all of its device memory, and the simulator's libraries (``sim/``) are ``dlopen``-ed into the
process. Whoever can write into a cache directory can therefore run code as its user, so a directory is used
only when nobody else can:

* **Checked**, as OpenSSH checks ``~/.ssh``: the directory and its subfolders must be owned by the current
  user (or root) and writable by neither group nor others; so must every ancestor, except that a sticky
  world-writable one (a temp root) is fine, since others can neither rename nor remove what is ours in it.
  The verdict is computed once per process and directory (again only if the directory is replaced), never
  per launch: in-memory hits do not touch the disk at all. A directory made unsafe after its check is not
  noticed before the next process; each file is still checked when opened.
* **Owner-only**: every directory the library creates is made 0o700 and every file 0o600 explicitly
  (``mkdir`` and ``open`` go through the umask); the first check in a process tightens an existing
  directory of the user's own, its files and its subfolders to the same modes.
* **Opened relative to a held descriptor, never through a link**: entries are named relative to the
  directory's descriptor with ``O_NOFOLLOW`` and must be regular files owned by the user or root and not
  writable by others; anything else reads as a damaged entry, a miss that is rebuilt.

The ownership check is the security control. The checksums in each entry's metadata guard against corruption
only (a crash, a full disk, a stray edit): whoever could write an entry could write its metadata too.

Where (:func:`cache_root`): ``DFG_JIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/deep_fp8_gemm``. An explicit
directory that fails the checks raises :class:`UnsafeCacheDirError` (the variable, the directory, its owner
and mode, and the fix); the default location that fails is replaced, for the rest of the process, by a
private temporary directory, with one warning.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import functools
import os
import pwd
import re
import secrets
import shutil
import stat
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from .. import env

DIR_MODE = 0o700
FILE_MODE = 0o600
_SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a planted FIFO must fail the regular-file check, not hang.
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeCacheDirError(RuntimeError):
    """A cache directory that someone other than the user or root owns or can write into (or an ancestor)."""


class NotADirectoryCacheError(UnsafeCacheDirError):
    """The cache directory's path runs through a file; unusable, not unsafe: the compiler warns and builds uncached."""


class UntrustedEntryError(OSError):
    """A cache entry that is not a regular file owned by the user or root and writable by nobody else."""


# ---------------------------------------------------------------------------------------- checks
@dataclasses.dataclass(frozen=True)
class _Problem:
    """One failed check: the path, its owner and mode, and what is wrong with it."""

    path: str
    uid: int
    mode: int
    what: str

    def __str__(self) -> str:
        return f"{self.path} (owner {_user(self.uid)}, mode {self.mode:04o}) {self.what}"


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _judge(path: str, st: os.stat_result, *, ancestor: bool) -> _Problem | None:
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.geteuid(), 0):
        return _Problem(path, st.st_uid, mode, "is owned by another user")
    if mode & _SHARED_WRITE and not (ancestor and mode & stat.S_ISVTX):
        who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(mode & _SHARED_WRITE, "its group and others")
        return _Problem(path, st.st_uid, mode, f"is writable by {who}")
    return None


def _problems(real: str, fd: int) -> list[_Problem]:
    """Every failed check of the open directory ``fd`` (resolved path ``real``): it and its subfolders
    strictly, its ancestors with the sticky exception."""
    found = [_judge(real, os.fstat(fd), ancestor=False)]
    with os.scandir(fd) as entries:
        found += [_judge(os.path.join(real, e.name), e.stat(follow_symlinks=False), ancestor=False)
                  for e in entries if e.is_dir(follow_symlinks=False)]
    path, parent = real, os.path.dirname(real)
    while parent != path:  # up to and including "/"
        found.append(_judge(parent, os.stat(parent), ancestor=True))
        path, parent = parent, os.path.dirname(parent)
    return [p for p in found if p is not None]


def _unsafe_message(directory: Path, problems: Iterable[_Problem]) -> str:
    """What :class:`UnsafeCacheDirError` says: the directory, each failed check, the fix."""
    problems = list(problems)
    named = "DFG_JIT_CACHE_DIR" if env.jit_cache_dir_is_explicit() else "the default: DFG_JIT_CACHE_DIR is unset"
    lines = [f"deep_fp8_gemm will not use the JIT cache directory {directory} ({named}): it holds code this "
             "process runs, and someone other than you or root owns or can write part of it:"]
    lines += [f"  {p}" for p in problems]
    fix = ("Fix: point DFG_JIT_CACHE_DIR at a directory of your own (unset, it is ~/.cache/deep_fp8_gemm; the "
           "docs/security.md says how to share warm caches)")
    if all(p.uid == os.geteuid() for p in problems):  # chmod is theirs to run
        fix += (", or `chmod go-w` each path above, after removing the cache directory unless you trust "
                "everything in it (it is only a cache)")
    lines.append(fix + ".")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- directories
@dataclasses.dataclass(frozen=True)
class _Verdict:
    identity: tuple[int, int]  # (st_dev, st_ino) of the directory that was checked
    problems: tuple[_Problem, ...]


_VERDICTS: dict[str, _Verdict] = {}  # by resolved path
_RESOLVED: dict[str, str] = {}  # directory as named -> resolved path (realpath is the dearest step of a disk hit)


@contextlib.contextmanager
def opened(directory: Path, *, create: bool = False) -> Iterator[OpenDir]:
    """``directory``, checked (once per process) and open; its descriptor is closed on exit.

    With ``create``, missing directories (``directory`` and its ancestors) are made, each 0o700.

    Raises:
        FileNotFoundError: it does not exist (and not ``create``).
        UnsafeCacheDirError: it fails the checks.
        OSError: it cannot be created or opened.
    """
    fd, real = _open_dir(os.fspath(directory), create)
    try:
        _check(directory, real, fd)
        yield OpenDir(fd, Path(directory), real)
    finally:
        os.close(fd)


def _open_dir(directory: str, create: bool) -> tuple[int, str]:
    real = _RESOLVED.get(directory)
    if real is not None:
        with contextlib.suppress(OSError):  # removed or replaced since: resolve again
            return os.open(real, _OPEN_DIR), real
    real = _RESOLVED[directory] = os.path.realpath(directory)
    try:
        return os.open(real, _OPEN_DIR), real
    except FileNotFoundError:
        if not create:
            raise
    except NotADirectoryError:  # the path (or an ancestor) is a file: say which setting points there
        raise NotADirectoryCacheError(_not_a_directory(directory)) from None
    try:
        _make_dirs(os.path.abspath(directory))
    except NotADirectoryError:
        raise NotADirectoryCacheError(_not_a_directory(directory)) from None
    real = _RESOLVED[directory] = os.path.realpath(directory)
    return os.open(real, _OPEN_DIR), real


def _not_a_directory(directory: str) -> str:
    return (f"the cache directory {directory} cannot be made: it, or one of its parents, is not a directory (a file "
            f"is in the way); set DFG_JIT_CACHE_DIR (or XDG_CACHE_HOME) to a directory you own, or DFG_JIT_DISABLE_CACHE=1")


def _make_dirs(path: str) -> None:
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue  # made concurrently: the checks decide whether it can be used
        fd = os.open(path, _OPEN_DIR)
        try:
            os.fchmod(fd, DIR_MODE)  # mkdir's mode went through the umask
        finally:
            os.close(fd)


def _check(directory: Path, real: str, fd: int) -> None:
    st = os.fstat(fd)
    verdict = _VERDICTS.get(real)
    if verdict is None or verdict.identity != (st.st_dev, st.st_ino):
        verdict = _Verdict((st.st_dev, st.st_ino), tuple(_problems(real, fd)))
        if not verdict.problems:
            _tighten(fd, depth=1)
        _VERDICTS[real] = verdict
    if verdict.problems:
        raise UnsafeCacheDirError(_unsafe_message(directory, verdict.problems))


def _tighten(fd: int, *, depth: int) -> None:
    """Makes what the user owns here owner-only: the directory 0o700, its files 0o600, its subfolders (to
    ``depth`` levels) likewise."""
    _own_mode(fd, DIR_MODE)
    with os.scandir(fd) as entries:
        for entry in entries:
            is_dir = entry.is_dir(follow_symlinks=False)
            if not (is_dir and depth > 0 or entry.is_file(follow_symlinks=False)):
                continue  # links and special files are never opened, so never loaded
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to open
                child = os.open(entry.name, _OPEN_DIR if is_dir else _OPEN_FILE, dir_fd=fd)
                try:
                    if is_dir:
                        _tighten(child, depth=depth - 1)
                    else:
                        _own_mode(child, FILE_MODE)
                finally:
                    os.close(child)


def _own_mode(fd: int, mode: int) -> None:
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
        os.fchmod(fd, mode)


class OpenDir:
    """A checked cache directory, open: entries are named relative to its descriptor, never through a link.

    ``path`` is the directory as the caller named it, ``real`` the resolved path that was checked (give that
    one to child processes)."""

    def __init__(self, fd: int, path: Path, real: str):
        self.fd, self.path, self.real = fd, path, real

    def open(self, name: str) -> int:
        """A read-only descriptor of the entry ``name`` (the caller closes it).

        Raises:
            FileNotFoundError: no such entry.
            UntrustedEntryError: not a regular file owned by the user or root and writable by nobody else.
            OSError: a link (``ELOOP``) or unreadable.
        """
        fd = os.open(name, _OPEN_FILE, dir_fd=self.fd)
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and _judge(name, st, ancestor=False) is None:
            return fd
        os.close(fd)
        raise UntrustedEntryError(f"{self.path / name} is not a regular file of yours (or root's) that only its "
                                  f"owner can write (owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o})")

    def open_built(self, name: str) -> int:
        """:meth:`open` for a file a child process (the compiler) just wrote here, made 0o600 first: the child
        created it through the umask."""
        fd = os.open(name, _OPEN_FILE, dir_fd=self.fd)
        try:
            _own_mode(fd, FILE_MODE)
        finally:
            os.close(fd)
        return self.open(name)

    def read(self, name: str) -> bytes:
        """The bytes of the entry ``name`` (checked as :meth:`open` does)."""
        with os.fdopen(self.open(name), "rb") as f:
            return f.read()

    @staticmethod
    def temp_name(name: str) -> str:
        """A fresh temporary name beside ``name`` (``.<name>.<random>.tmp``)."""
        return f".{name}.{secrets.token_hex(6)}.tmp"

    def write_atomic(self, name: str, data: bytes) -> None:
        """Writes ``data`` to a new 0o600 temporary file, fsyncs it, then renames it over ``name``."""
        tmp = self.temp_name(name)
        fd = os.open(tmp, _CREATE_FILE, FILE_MODE, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), FILE_MODE)  # the open's mode went through the umask
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # the rename must not reach the disk before the data
            self.replace(tmp, name)
        except BaseException:
            self.unlink(tmp)
            raise

    def replace(self, src: str, dst: str) -> None:
        """Renames the entry ``src`` over ``dst`` (atomic)."""
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        """Deletes the entry ``name`` if present (a link is deleted, never followed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[None]:
        """Exclusive inter-process lock on the file ``name`` (blocks). Lock files are left in place: deleting
        one while another process waits on it would let a third process lock a fresh file concurrently."""
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=self.fd)
        try:
            _own_mode(fd, FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield  # closing the descriptor releases the lock
        finally:
            os.close(fd)

    def files(self, pattern: re.Pattern) -> list[tuple[str, int]]:
        """``(name, bytes)`` of the regular files here whose names match ``pattern``."""
        with os.scandir(self.fd) as entries:
            return [(e.name, e.stat(follow_symlinks=False).st_size) for e in entries
                    if e.is_file(follow_symlinks=False) and pattern.match(e.name)]


# ---------------------------------------------------------------------------------------- where
def cache_root() -> Path:
    """The directory both caches live in: ``DFG_JIT_CACHE_DIR`` (checked on first use, refused with
    :class:`UnsafeCacheDirError`), else the default location, replaced by a private temporary directory
    for this process (one warning) if it fails the checks."""
    directory = env.jit_cache_dir()
    return directory if env.jit_cache_dir_is_explicit() else _default_root(directory)


@functools.lru_cache(maxsize=None)
def _default_root(directory: Path) -> Path:
    try:
        with opened(directory, create=True):
            return directory
    except UnsafeCacheDirError as exc:
        private = Path(tempfile.mkdtemp(prefix="deep_fp8_gemm-"))  # 0o700, a fresh name
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        warnings.warn(f"{exc}\nThis process uses a private cache instead ({private}, removed at exit).",
                      RuntimeWarning, stacklevel=2)
        return private
    except OSError:
        return directory  # cannot be made here: the caches report that where they use it


def describe(directory: Path) -> tuple[bool, str]:
    """``(passed, text)``: the checks' result for ``directory`` as ``cache info`` shows it (nothing is
    created)."""
    try:
        with opened(directory) as d:
            st = os.fstat(d.fd)
    except FileNotFoundError:
        return True, f"not created yet (it will be made owner-only, {DIR_MODE:04o})"
    except UnsafeCacheDirError as exc:
        return False, str(exc)
    except OSError as exc:
        return False, f"unusable: {exc}"
    return True, (f"ok: owned by {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}; neither it, its "
                  "subfolders nor its ancestors can be written by anyone else (a sticky temp root excepted)")


def tally(directory: Path, pattern: re.Pattern, entry_suffix: str) -> dict:
    """``{"dir", "entries", "bytes"}`` of the cache files in ``directory`` (names matching ``pattern``):
    entries = files ending in ``entry_suffix``, bytes = all of them (zeros when it does not exist)."""
    try:
        with opened(directory) as d:
            files = d.files(pattern)
    except FileNotFoundError:
        files = []
    return {"dir": str(directory), "entries": sum(1 for name, _ in files if name.endswith(entry_suffix)),
            "bytes": sum(size for _, size in files)}


def clear(directory: Path, pattern: re.Pattern, entry_suffix: str) -> int:
    """Deletes the cache files in ``directory`` (those ending in ``entry_suffix`` first: they vouch for the
    rest); returns how many of those there were. Files the caches did not create are left alone."""
    try:
        with opened(directory) as d:
            names = sorted((name for name, _ in d.files(pattern)), key=lambda n: not n.endswith(entry_suffix))
            for name in names:
                d.unlink(name)
    except FileNotFoundError:
        return 0
    return sum(1 for name in names if name.endswith(entry_suffix))
