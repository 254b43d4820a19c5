"""Bench a run's int8 and narrow-table rows on another machine without network: recall@10, p50 and peak RSS there,
against reference embeddings made here. Two steps:

    .venv/bin/python benchmarks/second_cpu.py pack runs/demo carry/ original-int8 original-int8-aware …
    python3 benchmarks/second_cpu.py bench carry/            # there: numpy and onnxruntime alone
    qemu-x86_64 -cpu EPYC-Rome .venv/bin/python benchmarks/second_cpu.py bench carry/ --recall-only  # AVX2's kernels

`pack` copies each row's graph (the fp32 original stays: the reference embeddings of the eval and second texts,
and their token batches, go in data.npz instead), so that the folder stays small (the device machine takes 64
MiB); `bench` prints the CPU, its integer path and ONNX Runtime's version, then each row's figures as JSON."""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# The flags of the integer paths (eval/environment.py's names), best first, and the CPUID feature each needs
PATHS = {"amx_int8": "amx", "avx512_vnni": "avx512_vnni", "avx_vnni": "avx_vnni", "avx512bw": "avx512", "avx2": "avx2"}
NEEDS = {"amx_int8": "AVX512VNNI", "avx512_vnni": "AVX512VNNI", "avx_vnni": "AVX512VNNI", "avx512bw": "AVX512BW"}
NEEDS["avx2"] = "AVX2"


def pack(run: Path, out: Path, rows: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from eval.graph import make_session
    from eval.kinds import graph_kind
    from files.model_folder import graph_in, targets_held
    from texts.corpus import SECOND, passages
    from texts.tokens import encode_passages, load_tokenizer

    original = graph_in(run / "original")
    kind, tokenizer, data = graph_kind(original), load_tokenizer(run / "original"), {}
    session = make_session(original, threads=2)
    for key, texts in (("eval", kind.passages(None, "eval")[0]), ("second", passages(None, SECOND)[0][:300])):
        batches = encode_passages(tokenizer, texts)
        data[f"{key}_n"] = np.array(len(batches))
        for i, batch in enumerate(batches):
            data[f"{key}_{i}_ids"], data[f"{key}_{i}_mask"] = batch["input_ids"], batch["attention_mask"]
        data[f"{key}_ref"] = kind.represent(session, batches)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "data.npz", **data)
    report = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    said = {key: report.get(key) for key in ("model", "eval_text", "second_text")}
    (out / "meta.json").write_text(json.dumps({**said, "original_bytes": original.stat().st_size}, indent=1))
    for row in rows:  # a row written for several CPUs: each graph, as ROW.TARGET.onnx
        held = targets_held(run / row)
        for target, graph in held.items():
            shutil.copy(graph, out / f"{row}.{target}.onnx")
        if not held:
            shutil.copy(graph_in(run / row), out / f"{row}.onnx")


def _session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feed(session, ids: np.ndarray, mask: np.ndarray) -> dict:
    given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {i.name: given[i.name] for i in session.get_inputs()}


def _embed(session, data, key: str) -> np.ndarray:
    """Mean-pooled last hidden states of the packed batches of `key`."""
    out = []
    for i in range(int(data[f"{key}_n"])):
        ids, mask = data[f"{key}_{i}_ids"], data[f"{key}_{i}_mask"]
        hidden = session.run(None, _feed(session, ids, mask))[0]
        weights = mask[..., None].astype(np.float32)
        out.append((hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9))
    return np.concatenate(out)


def _recall(reference: np.ndarray, other: np.ndarray, k: int = 10) -> float:
    """Mean over passages of |kNN_ref ∩ kNN_other| / k, neighbours by cosine, self excluded (eval.quality's)."""

    def neighbours(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        similarity = (x @ x.T).astype(np.float64)
        np.fill_diagonal(similarity, -np.inf)
        # a stable sort: numpy's SIMD quicksort of float32 (x86-simd-sort's AVX2 path) sorts wrongly under
        # qemu-x86_64 7.2 -cpu EPYC-Rome (80 of 292 rows on the eval text), the other sorts do not
        return np.argsort(-similarity, axis=1, kind="stable")[:, :k]

    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(neighbours(reference), neighbours(other))]))


def _peak(graph: str, folder: Path) -> int:
    """VmHWM of a fresh process that loads `graph` ("none": nothing) and runs a (1,16) and an (8,128) batch."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, __file__, "probe", str(folder), graph], capture_output=True, env=env)
    return int(done.stdout)


def probe(folder: Path, graph: str) -> None:
    if graph != "none":
        session = _session(Path(graph), 2)
        stream = np.load(folder / "data.npz")["eval_0_ids"].ravel()
        for batch, seq in ((1, 16), (8, 128)):
            ids = np.resize(stream, batch * seq).reshape(batch, seq).astype(np.int64)
            session.run(None, _feed(session, ids, np.ones_like(ids)))
    status = Path("/proc/self/status").read_text().splitlines()
    print(next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:")))


def _cpuid() -> list[str]:
    """The x86 features this process's CPUID shows (numpy reads it as ONNX Runtime does): under an emulator
    (`qemu-x86_64 -cpu EPYC-Rome`) /proc/cpuinfo is still the host's."""
    from numpy._core._multiarray_umath import __cpu_features__ as features

    return [name for name in ("AVX2", "AVX512BW", "AVX512VNNI") if features.get(name)]


def _integer_path(flags: list[str], cpuid: list[str]) -> str:
    """eval.environment's name of the best path the flags show and this process's CPUID allows."""
    return next((PATHS[f] for f in PATHS if f in flags and NEEDS[f] in cpuid), "sse")


def bench(folder: Path, out: Path | None, runs: int = 30, timed: bool = True) -> None:
    """Each graph's recall@10 on both texts; with `timed`, its peak RSS and p50s too (not under an emulator). With
    `out`, a report.json of them too (tools/benchmarks_page.py reads it like a run's)."""
    import onnxruntime as ort

    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    flags, cpuid = [flag for flag in PATHS if f" {flag}" in cpuinfo], _cpuid()
    host = _integer_path(flags, [NEEDS[f] for f in flags])
    env = {"cpu": model, "integer_path": _integer_path(flags, cpuid), "cores": os.cpu_count()}
    if env["integer_path"] != host:
        env["emulated"] = f"CPUID shows {env['integer_path']}, /proc/cpuinfo {host}"
    env.update(onnxruntime=ort.__version__, python=platform.python_version(), numpy=np.__version__)
    print(json.dumps(env), flush=True)
    data, rows = np.load(folder / "data.npz"), {}
    for path in sorted(folder.glob("*.onnx")):
        session = _session(path, 2)
        rows[path.stem] = {
            "file_bytes": path.stat().st_size,
            "recall_at_10": _recall(data["eval_ref"], _embed(session, data, "eval")),
            "recall_at_10_second": _recall(data["second_ref"], _embed(session, data, "second")),
        }
        if timed:
            rows[path.stem]["peak_rss_bytes"] = min(_peak(str(path), folder) for _ in range(2))
        print(json.dumps({path.stem: rows[path.stem]}), flush=True)
    if timed:
        stream = data["eval_0_ids"].ravel()
        for batch, seq, threads in ((1, 16, 1), (8, 128, 2)):
            sessions = {name: _session(folder / f"{name}.onnx", threads) for name in rows}
            ids = np.resize(stream, batch * seq).reshape(batch, seq).astype(np.int64)
            times = {name: [] for name in rows}
            for _ in range(runs + 1):  # the graphs taking turns; the first round warms them
                for name, session in sessions.items():
                    start = time.perf_counter()
                    session.run(None, _feed(session, ids, np.ones_like(ids)))
                    times[name].append(time.perf_counter() - start)
            for name in rows:
                rows[name][f"p50_b{batch}_s{seq}_t{threads}_ms"] = 1000 * float(np.median(times[name][1:]))
        print(json.dumps({"baseline_rss_bytes": _peak("none", folder), "rows": rows}, indent=1))
    if out is not None:
        out.write_text(json.dumps(_report(folder, env, rows), indent=1) + "\n")


def _report(folder: Path, env: dict, rows: dict) -> dict:
    """The figures in a report.json's shape: the original's row (the reference: recall 1) first."""
    meta = json.loads((folder / "meta.json").read_text()) if (folder / "meta.json").is_file() else {}
    original = {"name": "original", "quality": {"recall_at_10": 1.0}, "quality_second_text": {"recall_at_10": 1.0}}
    if meta.get("original_bytes"):
        original["file_bytes"] = meta["original_bytes"]
    variants = [original]
    for name, figures in rows.items():
        row = {"name": name, "file_bytes": figures["file_bytes"]}
        row["quality"] = {"recall_at_10": round(figures["recall_at_10"], 4)}
        row["quality_second_text"] = {"recall_at_10": round(figures["recall_at_10_second"], 4)}
        if "peak_rss_bytes" in figures:
            row["peak_rss_bytes"] = figures["peak_rss_bytes"]
        timed = {k[4:-3]: {"p50": round(v, 4)} for k, v in figures.items() if k.startswith("p50_")}
        if timed:
            row["latency_ms"] = timed
        variants.append(row)
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    run = {"command": " ".join(["python", "benchmarks/second_cpu.py", *sys.argv[1:]]), "date": date}
    return {
        **{k: meta.get(k) for k in ("model", "eval_text", "second_text")},
        "environment": env,
        "run": run,
        "variants": variants,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    packing = sub.add_parser("pack")
    packing.add_argument("run", type=Path)
    packing.add_argument("out", type=Path)
    packing.add_argument("rows", nargs="+")
    benching = sub.add_parser("bench")
    benching.add_argument("folder", type=Path)
    benching.add_argument("--json", type=Path, default=None, help="also write the figures as a report.json")
    benching.add_argument(
        "--recall-only",
        action="store_true",
        help="recall alone, no time or memory: for an emulated CPU (qemu-x86_64 -cpu EPYC-Rome: AVX2's kernels)",
    )
    probing = sub.add_parser("probe")
    probing.add_argument("folder", type=Path)
    probing.add_argument("graph")
    args = parser.parse_args()
    if args.step == "pack":  # every input there before any work: one sentence, exit 2
        missing = [r for r in ("original", *args.rows) if not (args.run / r / "onnx").is_dir()]
        if missing:
            parser.error(f"{args.run} has no ready folder {missing[0]!r} (a run's rows: original, original-int8, …)")
    elif not (args.folder / "data.npz").is_file():
        parser.error(f"{args.folder} holds no data.npz: make the folder with `second_cpu.py pack` first")
    if args.step == "pack":
        pack(args.run, args.out, args.rows)
    elif args.step == "bench":
        bench(args.folder, args.json, timed=not args.recall_only)
    else:
        probe(args.folder, args.graph)


if __name__ == "__main__":
    main()
