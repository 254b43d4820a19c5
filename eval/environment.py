"""What a figure was measured on and with: the CPU and its integer path (the instructions ONNX Runtime's int8
kernels multiply with), the library versions, the run's command, commit and date, and the hashes of the texts
and graphs, so that two reports that differ can say which input did.

The integer paths, as ONNX Runtime's MLAS picks its u8 × s8 kernel on x86-64: `amx` (AMX tiles), `avx512_vnni`
and `avx_vnni` (vpdpbusd: each product summed straight into int32), `avx512` and `avx2` (vpmaddubsw: two
products summed in int16 first, which saturates past ±32,767 unless the weights keep to 7 bits); on ARM,
`arm64_dot` (sdot/udot, into int32) and `arm64`."""

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np

from files.onnx_files import graph_pieces

__all__ = [
    "INTEGER_PATHS",
    "PAIRS_IN_INT16",
    "integer_path",
    "cpu_model",
    "machine",
    "run_record",
    "file_sha256",
    "graph_sha256",
    "texts_sha256",
    "batches_sha256",
]

# Each integer path, best first, and the CPU flag (/proc/cpuinfo) that shows it
INTEGER_PATHS = {
    "amx": "amx_int8",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512": "avx512bw",
    "avx2": "avx2",
    "arm64_dot": "asimddp",
}
# numpy's CPUID features → the /proc/cpuinfo flag each is; the flags numpy does not read (AMX, AVX-VNNI) are
# dropped too where it denies one of those (an emulator or a masked CPU model, which offers neither)
CPUID_FLAGS = {"AVX512VNNI": "avx512_vnni", "AVX512BW": "avx512bw", "AVX2": "avx2"}
UNSEEN_FLAGS = frozenset({"amx_int8", "avx_vnni"})
PAIRS_IN_INT16 = frozenset({"avx512", "avx2", "sse"})  # the paths whose u8 × s8 pairs are summed in int16
VERSIONS = ("onnxruntime", "onnx", "torch", "transformers", "numpy", "tokenizers")


def _cpuinfo() -> str:
    path = Path("/proc/cpuinfo")
    return path.read_text() if path.is_file() else ""


def _flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpuid_allows(flags: set[str]) -> set[str]:
    """`flags` less those the process's own CPUID denies (numpy reads it, as ONNX Runtime does): /proc/cpuinfo is
    the host's even under an emulator (`qemu-x86_64 -cpu EPYC-Rome`) or a CPU model that masks features."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return flags
    if not features.get("SSE2"):  # not x86-64
        return flags
    denied = {flag for feature, flag in CPUID_FLAGS.items() if flag in flags and not features.get(feature)}
    return flags - denied - (UNSEEN_FLAGS if denied else frozenset())


def integer_path(cpuinfo: str | None = None) -> str:
    """This machine's integer path (INTEGER_PATHS' name; `sse` or `arm64` when none of them), from `cpuinfo`
    (the text of /proc/cpuinfo; default: this machine's, less the flags this process's CPUID denies)."""
    flags = _flags(cpuinfo) if cpuinfo is not None else _cpuid_allows(_flags(_cpuinfo()))
    for path, flag in INTEGER_PATHS.items():
        if flag in flags:
            return path
    return "arm64" if platform.machine().lower() in ("aarch64", "arm64") else "sse"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (platform's processor string elsewhere)."""
    for line in _cpuinfo().splitlines():
        if line.split(":")[0].strip() in ("model name", "Model"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict:
    """{"cpu", "integer_path", "cores", "python", and each of VERSIONS}: what every figure of a report ran on;
    "emulated" where the process's CPUID shows another path than the host's /proc/cpuinfo."""
    record = {"cpu": cpu_model(), "integer_path": integer_path(), "cores": os.cpu_count()}
    host = integer_path(_cpuinfo())
    if host != record["integer_path"]:  # times under an emulator are not the hardware's
        record["emulated"] = f"CPUID shows {record['integer_path']}, /proc/cpuinfo {host}"
    record["python"] = platform.python_version()
    record.update({package: _version(package) for package in VERSIONS})
    return record


def _commit() -> str | None:
    """The checkout's commit of this package (with "-dirty" when it has changes), None outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_record(argv: list[str] | None = None) -> dict:
    """{"command", "commit", "date"}: the command line that made the report (`argv`, default sys.argv)."""
    argv = sys.argv if argv is None else argv
    command = " ".join(["compressor", *argv[1:]]) if argv and Path(argv[0]).name == "compressor" else " ".join(argv)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"command": command, "commit": _commit(), "date": date}


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (with its external data file, when it has one beside it)."""
    digest = hashlib.sha256()
    path = Path(path)
    for part in (path, path.with_name(path.name + ".data")):
        if part.is_file():
            with part.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()


def graph_sha256(path: str | Path) -> str:
    """The sha256 of a graph without its metadata: the weights and operators alone, which two CPUs that write the
    same graph share (the metadata holds the parity each CPU's kernels measured); read a piece at a time
    (files.onnx_files.graph_pieces)."""
    digest = hashlib.sha256()
    for piece in graph_pieces(path):
        digest.update(piece)
    return digest.hexdigest()


def texts_sha256(passages: list[str]) -> str:
    """The sha256 of passages, each ended by a NUL (so that no two splits of one text hash alike)."""
    digest = hashlib.sha256()
    for passage in passages:
        digest.update(passage.encode("utf-8") + b"\0")
    return digest.hexdigest()


def batches_sha256(batches: list[dict]) -> str:
    """The sha256 of input batches (their arrays in order of name), as the calibration reads them."""
    digest = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            digest.update(name.encode() + np.ascontiguousarray(batch[name]).tobytes())
    return digest.hexdigest()
