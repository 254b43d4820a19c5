"""Where outputs go, and how they get there. Outputs appear under their final name only when
complete: write to a temporary sibling, then rename (os.replace is atomic on one file system).
Output locations are checked before any work (`check_writable`), free space before a write of
known size (`check_free`), and a disk that fills up during a write is one sentence (exit 1)."""

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from compressor.errors import CompressorError, OutOfSpaceError

__all__ = ["atomic_file", "atomic_dir", "cache_dir", "check_writable", "check_free", "tensor_bytes"]


def cache_dir() -> Path:
    """Where what can be computed again is kept: $XDG_CACHE_HOME/compressor, else ~/.cache/compressor."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "compressor"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def check_writable(path: Path, what: str) -> None:
    """One clear error unless `path` (a file or folder to write, `what` names it) could be created:
    its nearest existing ancestor must be a folder in which a file can be made (tried, then removed)."""
    path = Path(path)
    if path.is_dir() and what.endswith("file"):
        raise CompressorError(f"cannot write the {what} {str(path)!r}: it is a folder")
    if path.exists() and not path.is_dir() and what.endswith("folder"):
        raise CompressorError(f"cannot write the {what} {str(path)!r}: a file of that name is there")
    base = path if path.is_dir() else _existing_ancestor(path.parent)
    if not base.is_dir():
        raise CompressorError(f"cannot write the {what} {str(path)!r}: {str(base)!r} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".compressor-probe.", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CompressorError(f"cannot write the {what} {str(path)!r}: {e.strerror or e} in {str(base)!r}") from None


def _free(path: Path) -> int:
    return shutil.disk_usage(_existing_ancestor(path)).free


def _written(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def tensor_bytes(tensors) -> int:
    """Bytes the tensors hold: what a file of them needs, give or take its header."""
    return sum(t.numel() * t.element_size() for t in tensors)


def check_free(path: Path, needed: int) -> None:
    """OutOfSpaceError before writing `needed` bytes to `path` when fewer are free."""
    free = _free(path)
    if needed > free:
        raise OutOfSpaceError(f"not enough space to write {str(path)!r}: it needs {needed:,} bytes, {free:,} are free")


def _disk_full(e: Exception) -> bool:
    """An OSError of a full disk or quota, or a writer's own error saying so (safetensors reports
    "I/O error: … (os error 28)" in a SafetensorError)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(f"(os error {n})" in str(e) for n in (errno.ENOSPC, errno.EDQUOT))


@contextlib.contextmanager
def _out_of_space_said(final: Path, tmp: Path, needed: int | None) -> Iterator[None]:
    """A full disk while writing `tmp` becomes one OutOfSpaceError naming `final`."""
    try:
        yield
    except Exception as e:
        if not _disk_full(e):
            raise
        size = f"it needed about {needed:,} bytes, " if needed else ""
        raise OutOfSpaceError(
            f"the disk filled up while writing {str(final)!r}: {size}{_written(tmp):,} were written before it "
            f"failed, {_free(final):,} bytes are free; nothing was written under that name"
        ) from None


def _ready(final: Path, needed: int | None) -> Path:
    """`final` as a Path, its folder made, after the free-space check when `needed` is known."""
    final = Path(final)
    if needed is not None:
        check_free(final, needed)
    final.parent.mkdir(parents=True, exist_ok=True)
    return final


@contextlib.contextmanager
def atomic_file(final: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a path of `final`'s name in a temporary folder beside it; move it to `final` if the block succeeds, and
    with it, first, what the block wrote beside it there (a graph's weights file, PATH.data, named after the final
    name its graph refers to it by); a FINAL.data the block did not write, an earlier graph's weights, is removed
    once its graph is replaced. With `needed` (bytes), the free space is checked first."""
    final = _ready(final, needed)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    tmp = work / final.name
    tmp.touch(0o666)  # the umask applies, as to any new file
    try:
        with _out_of_space_said(final, work, needed):
            yield tmp
        written = sorted(p for p in work.iterdir() if p != tmp)
        for beside in written:
            os.replace(beside, final.parent / beside.name)
        os.replace(tmp, final)
        stale = final.with_name(f"{final.name}.data")
        if stale.name not in {p.name for p in written}:
            stale.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(final: Path, needed: int | None = None) -> Iterator[Path]:
    """Yield a temporary directory beside `final`; on success it replaces `final` whole. With
    `needed` (bytes), the free space is checked first."""
    final = _ready(final, needed)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        with _out_of_space_said(final, tmp, needed):
            yield tmp
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
