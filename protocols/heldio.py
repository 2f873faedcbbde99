"""Small local file calls that keep the GIL, for bursts of them on a busy process.

Python releases the GIL around every file system call so that other threads run while the call
waits on the disk. For a call that takes microseconds that is a loss once other threads are busy:
the caller gets the GIL back only when the running thread gives it up, up to the switch interval
later (5 ms: the "convoy effect", bpo-7946). Writing two small files for each of a thousand jobs
took 0.3 s alone and 58 s beside one busy thread; through these functions, 0.12 s alone and
1.2 s beside two (bench/RESULTS.md). They call libc through `ctypes.PyDLL`, which keeps the GIL.

Only for small files on a local disk, from code that does many of them in a row (the sim cloud's
folder, the virtual machines' fetches): while one of these calls runs, no other Python thread
does. Where libc cannot be called this way (not Linux), they are the plain `os` calls.
Errors are raised as `os` raises them (`FileNotFoundError` and the like, with the path).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

_F_OK = 0
_CHUNK = 1 << 16


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        sigs: dict[str, tuple[list[Any], Any]] = {
            "fopen": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_void_p),
            "write": ([ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_ssize_t),
            "fwrite": ([ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_size_t),
            "fread": ([ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p], ctypes.c_size_t),
            "ferror": ([ctypes.c_void_p], ctypes.c_int),
            "fclose": ([ctypes.c_void_p], ctypes.c_int),
            "mkdir": ([ctypes.c_char_p, ctypes.c_uint], ctypes.c_int),
            "rename": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
            "unlink": ([ctypes.c_char_p], ctypes.c_int),
            "access": ([ctypes.c_char_p, ctypes.c_int], ctypes.c_int),
        }
        for name, (args, result) in sigs.items():
            fn = getattr(libc, name)
            fn.argtypes, fn.restype = args, result
    except (OSError, AttributeError):
        return None
    return libc


_C = _libc()
HELD = _C is not None  # False: these are the plain os calls


def _error(path: str | os.PathLike[str]) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code), os.fspath(path))  # OSError picks the subclass by errno


def _b(path: str | os.PathLike[str]) -> bytes:
    return os.fsencode(path)


def write_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create or truncate `path` and write `data` (mode 0666 less the umask, close-on-exec)."""
    if _C is None:
        with open(path, "wb") as f:
            f.write(data)
        return
    fp = _C.fopen(_b(path), b"we")
    if not fp:
        raise _error(path)
    written = _C.fwrite(data, 1, len(data), fp) if data else 0
    failed = written != len(data)
    if _C.fclose(fp) != 0 or failed:
        raise _error(path)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the open file `fd`."""
    while data:
        n = _C.write(fd, data, len(data)) if _C is not None else os.write(fd, data)
        if n < 0:
            raise _error(f"fd {fd}")
        data = data[n:]


def read_file(path: str | os.PathLike[str]) -> bytes:
    if _C is None:
        with open(path, "rb") as f:
            return f.read()
    fp = _C.fopen(_b(path), b"re")
    if not fp:
        raise _error(path)
    parts, buf = [], ctypes.create_string_buffer(_CHUNK)
    try:
        while True:
            n = _C.fread(buf, 1, _CHUNK, fp)
            if n:
                parts.append(buf.raw[:n])
            if n < _CHUNK:
                if _C.ferror(fp):
                    raise _error(path)
                return b"".join(parts)
    finally:
        _C.fclose(fp)


def makedirs(path: str | os.PathLike[str], mode: int = 0o777) -> None:
    """`os.makedirs(path, mode, exist_ok=True)`."""
    if _C is None:
        os.makedirs(path, mode, exist_ok=True)
        return
    if _mkdir(path, mode):
        return
    if ctypes.get_errno() == errno.ENOENT:
        parent = os.path.dirname(os.fspath(path).rstrip("/"))
        if parent and parent != os.fspath(path):
            makedirs(parent, mode)
            if _mkdir(path, mode):
                return
    raise _error(path)


def _mkdir(path: str | os.PathLike[str], mode: int) -> bool:
    """Made, or a folder already (`path/.` resolves only through a folder)."""
    return bool(_C.mkdir(_b(path), mode) == 0
                or (ctypes.get_errno() == errno.EEXIST and _C.access(_b(path) + b"/.", _F_OK) == 0))


def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """`os.replace(src, dst)`."""
    if _C is None:
        os.replace(src, dst)
    elif _C.rename(_b(src), _b(dst)) != 0:
        raise _error(src)


def unlink(path: str | os.PathLike[str], *, missing_ok: bool = False) -> None:
    if _C is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
    elif _C.unlink(_b(path)) != 0 and not (missing_ok and ctypes.get_errno() == errno.ENOENT):
        raise _error(path)


def exists(path: str | os.PathLike[str]) -> bool:
    """`os.path.exists(path)` (follows links)."""
    if _C is None:
        return os.path.exists(path)
    return bool(_C.access(_b(path), _F_OK) == 0)

