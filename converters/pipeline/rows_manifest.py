"""A run's rows manifest, where the part of a run that needs PyTorch hands over to the part that does not
(torch_free.py): OUT/rows-manifest.json holds the rows so far (Rows.state), the graph still to round and its schemes'
configs (SchemeConfig.to_dict), the bench's settings and texts and the command line; OUT/rows-manifest.npz beside it
the arrays (the calibration batches, the counts that rank a table head's rows, the bench's tokenised texts), read
without pickle. Each is written whole under its final name (files/atomic.py), the arrays first: a manifest that is
there has its arrays."""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compressor.errors import CompressorError
from converters.pipeline.rows import Rows
from converters.quantization.registry import SchemeConfig
from eval.benchmark import BenchInputs
from files.atomic import atomic_file

__all__ = ["MANIFEST", "Pending", "write_manifest", "read_manifest"]

MANIFEST = "rows-manifest.json"  # in the run's output folder; its arrays in rows-manifest.npz
FORMAT = ("compressor rows manifest", 1)  # its "manifest" and "version"


@dataclass(frozen=True)
class Pending:
    """The rows still to add: the fp32 graph at `graph` rounded in each of `schemes` as NAME-SCHEME, a table head's
    rows ranked by `head_counts` (scheme → counts (V,), for the schemes that keep a head)."""

    name: str
    graph: Path
    schemes: tuple[SchemeConfig, ...]
    head_counts: dict[str, np.ndarray]


def _batches(prefix: str, batches: list[dict]) -> dict[str, np.ndarray]:
    """{PREFIX/I/FEED: array} of a list of feeds."""
    return {f"{prefix}/{i}/{feed}": array for i, batch in enumerate(batches) for feed, array in batch.items()}


def _batches_back(prefix: str, arrays: dict[str, np.ndarray]) -> list[dict]:
    """The list of feeds `_batches` flattened under `prefix`."""
    found: dict[int, dict] = {}
    for key, array in arrays.items():
        if key.startswith(f"{prefix}/"):
            i, feed = key[len(prefix) + 1 :].split("/")
            found.setdefault(int(i), {})[feed] = array
    return [found[i] for i in sorted(found)]


def write_manifest(rows: Rows, pending: Pending, bench: dict) -> Path:
    """ROWS.out/rows-manifest.json (its path) and its arrays: `rows`, `pending` and the keywords of
    Rows.bench_and_report (`bench`, its `inputs` tokenised: eval.benchmark.bench_inputs)."""
    inputs: BenchInputs = bench["inputs"]
    arrays = {
        **_batches("calibration", rows.batches or []),
        **{f"head_counts/{scheme}": counts for scheme, counts in pending.head_counts.items()},
        **{name: array for key, batches in inputs.batches.items() for name, array in _batches(key, batches).items()},
        "stream": inputs.stream,
    }
    settings = {key: value for key, value in bench.items() if key != "inputs"}
    manifest = {
        "manifest": FORMAT[0],
        "version": FORMAT[1],
        "rows": rows.state(),
        "calibrated": rows.batches is not None,
        "pending": {
            "name": pending.name,
            "graph": str(pending.graph),
            "schemes": [config.to_dict() for config in pending.schemes],
        },
        "bench": {**settings, "inputs": {"keys": list(inputs.batches), "vocab": inputs.vocab}},
    }
    path = rows.out / MANIFEST
    with atomic_file(path.with_suffix(".npz")) as tmp, open(tmp, "wb") as f:
        np.savez(f, **arrays)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return path


def read_manifest(path: Path) -> tuple[Rows, Pending, dict]:
    """(rows, pending, bench keywords) of the manifest at `path` (write_manifest's); one sentence for a path that
    holds none."""
    path = Path(path)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as stored:
            arrays = {key: stored[key] for key in stored.files}
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CompressorError(f"{str(path)!r} is no rows manifest of a run (compressor run writes them): {e}") from None
    if not isinstance(manifest, dict) or [manifest.get("manifest"), manifest.get("version")] != list(FORMAT):
        raise CompressorError(f"{str(path)!r} is no {FORMAT[0]} of version {FORMAT[1]}")
    try:
        batches = _batches_back("calibration", arrays) if manifest["calibrated"] else None
        rows = Rows.from_manifest(manifest["rows"], batches)
        todo = manifest["pending"]
        counts = {key.split("/", 1)[1]: array for key, array in arrays.items() if key.startswith("head_counts/")}
        schemes = tuple(SchemeConfig.from_dict(config) for config in todo["schemes"])
        pending = Pending(todo["name"], Path(todo["graph"]), schemes, counts)
        bench = dict(manifest["bench"])
        said = bench.pop("inputs")
        batches = {key: _batches_back(key, arrays) for key in said["keys"]}
        bench["inputs"] = BenchInputs(batches, said["vocab"], arrays["stream"])
    except (KeyError, TypeError, AttributeError) as e:
        raise CompressorError(f"{str(path)!r} is a {FORMAT[0]} without its {e}") from None
    return rows, pending, bench
