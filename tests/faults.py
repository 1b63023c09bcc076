"""Real faults for the fail-safe tests: a read-only directory (also for root), a full disk."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest



class CannotMakeReadOnly(Exception):
    """This machine lets no way of making a directory read-only for this process."""


@contextlib.contextmanager
def read_only_or_skip(path: Path):
    """`read_only(path)`, or a pytest skip where that cannot be done."""
    fault = read_only(path)
    try:
        fault.__enter__()
    except CannotMakeReadOnly as e:
        pytest.skip(str(e))
    try:
        yield path
    finally:
        fault.__exit__(None, None, None)


class read_only:
    """Makes `path` read-only for this process: chmod for ordinary users; for root (whom chmod does not stop) a
    read-only bind mount. Raises `CannotMakeReadOnly` where neither works (root without mount)."""

    def __init__(self, path: Path):
        self.path = path
        self.mounted = False

    def __enter__(self):
        if os.geteuid() != 0:
            self.mode = self.path.stat().st_mode
            self.path.chmod(0o500)
            return self.path
        if shutil.which("mount") is None:
            raise CannotMakeReadOnly("running as root without mount")
        bind = subprocess.run(["mount", "--bind", str(self.path), str(self.path)], capture_output=True)
        if bind.returncode != 0:
            raise CannotMakeReadOnly(f"running as root and cannot bind-mount: {bind.stderr.decode().strip()}")
        self.mounted = True
        remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(self.path)], capture_output=True)
        if remount.returncode != 0:
            self.__exit__()
            raise CannotMakeReadOnly(f"cannot remount read-only: {remount.stderr.decode().strip()}")
        return self.path

    def __exit__(self, *exc):
        if self.mounted:
            subprocess.run(["umount", str(self.path)], check=True)
            self.mounted = False
        elif os.geteuid() != 0:
            self.path.chmod(self.mode)


class full_disk:
    """Makes writes under `path` fail with ENOSPC ("No space left on device").

    On a tmpfs that `small_tmpfs` mounted, the disk is really filled (a filler file takes the space left); elsewhere
    `os.fsync` (which thunderfx_debug's atomic writer calls before renaming a file into place, and where real file
    systems report a full disk of delayed allocations) fails with ENOSPC.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.monkeypatch = pytest.MonkeyPatch()
        self.filler: Path | None = None

    def __enter__(self):
        mount = _tmpfs_root(self.path)
        if mount is not None:
            self.filler = mount / ".filler"
            with open(self.filler, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
                try:
                    while True:
                        f.write(b"\0" * 65536)
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e
            return "tmpfs"

        def fsync_on_full_disk(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        self.monkeypatch.setattr(os, "fsync", fsync_on_full_disk)
        return "fsync"

    def __exit__(self, *exc):
        if self.filler is not None:
            self.filler.unlink()
        else:
            self.monkeypatch.undo()


_TMPFS_MOUNTS: list[Path] = []


def _tmpfs_root(path: Path) -> Path | None:
    for mount in _TMPFS_MOUNTS:
        if path == mount or mount in path.parents:
            return mount
    return None


class small_tmpfs:
    """Mounts a small tmpfs at `path` (root only); yields None where mounting is not allowed."""

    def __init__(self, path: Path, size: str = "16m"):
        self.path, self.size = Path(path), size
        self.mounted = False

    def __enter__(self) -> Path | None:
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            return None
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)],
                              capture_output=True)
        if done.returncode != 0:
            return None
        self.mounted = True
        _TMPFS_MOUNTS.append(self.path)
        return self.path

    def __exit__(self, *exc):
        if self.mounted:
            _TMPFS_MOUNTS.remove(self.path)
            subprocess.run(["umount", "-l", str(self.path)], check=False)
