"""Compress time and peak memory on models larger than the default: a 250,002-row table (XLM-R's vocabulary,
every embedding method) and whole models of 22M to ~1B parameters (low rank on every linear layer).

    python benchmarks/large_models.py vocab --out runs/large     # a random 12-layer XLM-R, 250,002 × 384
    python benchmarks/large_models.py sizes --out runs/large     # 22M, 110M, 135M, ~1B: aware against plain
    python benchmarks/large_models.py lms --out runs/large       # compressor run: SmolLM2, both shapes, and
                                                                 # Gemma-3-270M, Qwen2.5-Coder-0.5B (make lm-big)
    python benchmarks/large_models.py corrected --out runs/large # int4-corrected's export: SmolLM2, both shapes
        [--scheme int4-trained]                                  # or int4-trained's (its 240 s fine-tune on 2 cores)

Each `compressor compress` runs in its own process, without the calibration cache (every run pays for its
statistics); its wall time and peak resident memory (the process's own, from wait4) are printed and
written to OUT/large_models.json (a run it holds already is skipped unless --again). The random models
are built once under OUT (weights at random: only time and memory are measured here, never quality).
`sizes`, `lms` and `corrected` need `make lm` for SmolLM2-135M."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from converters.cli.corrected_needs import corrected_needs
from converters.cli.goals import default_shortlist, lm_run_needs
from converters.loading import stored_parameters
from converters.quantization.registry import scheme_named
from eval.pace import cpu_pace

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = REPO / "runs" / "lm" / "smollm2"
REAL_LMS = {"268M Gemma-3-270M": "gemma3-270m", "494M Qwen2.5-Coder-0.5B": "qwen2.5-coder-0.5b"}  # make lm-big's

VOCAB_RUNS = {
    "tt r32 plain": "--method tt --rank 32 --fit plain",
    "tt r32 aware": "--method tt --rank 32 --fit aware",
    "lowrank 0.25 plain": "--method lowrank --keep 0.25 --fit plain",
    "lowrank 0.25 aware": "--method lowrank --keep 0.25 --fit aware",
    "lowrank 0.25 fisher": "--method lowrank --keep 0.25 --fit fisher",
    "head 4096 + lowrank tail 0.125 aware": "--method lowrank --keep 0.125 --fit aware --dense-head 4096",
    "head 4096 + tt tail r32 aware": "--method tt --rank 32 --fit aware --dense-head 4096",
    "define (its default, fisher)": "--method define",
}
SIZE_PLAN = ["--method", "lowrank", "--targets", "linear", "--keep", "0.5"]
LARGE_CALIB_PASSAGES = "128"  # the ~1B model's calibration: 1,024 passages would take most of an hour here


def _xlmr_250k(out: Path) -> Path:
    """A random 12-layer XLM-R of paraphrase-multilingual-MiniLM's shape (250,002 × 384, 118M parameters)
    with the default model's tokenizer (its 30,522 ids are the only rows calibration sees)."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=250002,
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=514,
        pad_token_id=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(_default_model())
    return _save(out / "xlmr-250k", lambda: (XLMRobertaModel(config), tokenizer))


def _bert_110m(out: Path) -> Path:
    """A random BERT-base (12 × 768, 110M parameters) with the default model's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(_default_model())
    return _save(out / "bert-110m", lambda: (BertModel(BertConfig()), tokenizer))


def _llama_1b(out: Path) -> Path:
    """A random Llama of Llama-3.2-1B's body (16 × 2048, SwiGLU 8192, 8 key-value heads) with SmolLM2's
    tokenizer and tied 49,152-row table: 1.07B parameters."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return _save(out / "llama-1b", lambda: (LlamaForCausalLM(config), tokenizer))


def _tied_lm(path: Path, config_class: str, **shape) -> Path:
    """A random causal LM of transformers' `config_class` and `shape`, its table tied, with SmolLM2's tokenizer
    (its 49,152 ids are the only rows text reaches; the table keeps the model's own rows)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(SMOLLM2)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    config = getattr(transformers, config_class)(tie_word_embeddings=True, **ids, **shape)
    return _save(path, lambda: (transformers.AutoModelForCausalLM.from_config(config), tokenizer))


def _lms(out: Path, only: str) -> dict[str, str]:
    """Qwen2.5-0.5B's and Llama-3.2-1B's shapes, their own tables (151,936 and 128,256 rows), at random: those whose
    name holds `only`, built where missing."""
    shapes = {
        "Qwen2.5-0.5B shape (random)": (
            "qwen2.5-0.5b-shape",
            "Qwen2Config",
            dict(
                vocab_size=151936,
                hidden_size=896,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                intermediate_size=4864,
                max_position_embeddings=32768,
                rope_theta=1e6,
            ),
        ),
        "Llama-3.2-1B shape (random)": (
            "llama-3.2-1b-shape",
            "LlamaConfig",
            dict(
                vocab_size=128256,
                hidden_size=2048,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=8,
                intermediate_size=8192,
                max_position_embeddings=131072,
                rope_theta=5e5,
            ),
        ),
    }
    return {
        name: str(_tied_lm(out / folder, config_class, **shape))
        for name, (folder, config_class, shape) in shapes.items()
        if only in name
    }


def _tree_rss(root: int) -> int:
    """The resident bytes of process `root` and its descendants together, now (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
            children.setdefault(int(rest.rsplit(")", 1)[1].split()[1]), []).append(int(pid))
        except (OSError, ValueError, IndexError):  # gone since the listing
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def measure_run(model: Path, out: Path) -> dict:
    """One `compressor run MODEL` (an LM: its original's rows) as the shell runs it: its exit status, wall
    seconds, the CPU's pace just before it (eval.pace: what the time said before a run is scaled by), the model's
    parameters, the estimate it said before the work, each stage's time and peak RSS from its report (or the
    sentence it refused the model with), and the peak of its processes' resident memory together (`tree_peak_gib`,
    sampled every 0.2 s: the command's process and its children); its folder removed after."""
    argv = [str(Path(sys.executable).parent / "compressor"), "run", str(model), "--out", str(out)]
    _, minutes, peak = lm_run_needs(model, default_shortlist(model), handed_over=True)  # said before, from the shell
    estimate = {"minutes": minutes, "peak_gib": round(peak / 2**30, 1)}
    pace = cpu_pace()
    log = out.with_name(f"{model.name}.log")  # what it says as it goes, to follow it
    start = time.perf_counter()
    tree_peak = 0
    with open(log, "w") as stderr, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr) as done:
        while done.poll() is None:
            tree_peak = max(tree_peak, _tree_rss(done.pid))
            time.sleep(0.2)
    seconds = time.perf_counter() - start
    err = log.read_text()
    said = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("compressor:")]
    result = {"exit": done.returncode, "seconds": round(seconds, 1), "pace_s": pace, "params": stored_parameters(model)}
    result["tree_peak_gib"] = round(tree_peak / 2**30, 3)
    result.update({"said": said, "estimate": estimate, **_provenance()})
    if done.returncode == 0:
        report = json.loads((out / "report.json").read_text())
        result["stages"] = report["run"]["stages"]
        result["rows"] = {
            v["name"]: {"file_bytes": v["file_bytes"], "decode_ms": v.get("decode_ms")} for v in report["variants"]
        }
    elif done.returncode != 2:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return result


def _default_model() -> Path:
    from converters.loading import default_model_path

    return default_model_path()


def _save(path: Path, build) -> Path:
    """`path`, holding the model and tokenizer `build()` makes unless it holds them already."""
    if not (path / "config.json").is_file():
        import torch

        torch.manual_seed(0)
        model, tokenizer = build()
        model.eval().save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def measure(model: Path, options: list[str], out: Path) -> dict:
    """One `compressor compress` in a process of its own: wall seconds, peak RSS (GiB), what it said; its
    checkpoint removed after."""
    return _measured(["compress", str(model), *options, "--no-cache", "--out", str(out)], out)


def _measured(command: list[str], out: Path) -> dict:
    """`compressor COMMAND` in a process of its own: wall seconds, peak RSS (GiB, from wait4), what it said; OUT
    removed after."""
    argv = [sys.executable, "-m", "converters.cli", *command]
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    said = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("compressor:")]
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    shutil.rmtree(out)
    return {"seconds": round(seconds, 1), "peak_gib": round(usage.ru_maxrss / 2**20, 2), "said": said}


def measure_corrected(model: Path, out: Path, scheme: str) -> dict:
    """`compressor export MODEL --quantize SCHEME` (a corrected scheme, the default calibration) measured as
    `_measured`, with the commit, date and machine."""
    result = _measured(["export", str(model), "--quantize", scheme, "--out", str(out)], out)
    config = scheme_named(scheme)()
    train = getattr(config, "correction_time", 0.0) if config.trains else 0.0
    _, _, minutes, peak = corrected_needs(model, train > 0)  # what it said before its work
    estimate = {"minutes": minutes + round(train / 60), "peak_gib": round(peak / 2**30, 1)}
    return {**result, "estimate": estimate, **_provenance()}


def _provenance() -> dict:
    """The commit, the date (UTC) and the machine a measurement was taken on."""
    from eval.environment import integer_path, machine

    here = machine()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    environment = {"cpu": here["cpu"], "integer_path": integer_path(), "onnxruntime": here["onnxruntime"]}
    return {
        "commit": commit or None,
        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
        "environment": environment,
    }


def _models(what: str, out: Path, only: str = "") -> dict[str, str]:
    """The models of `what` by name (the LMs: those whose name holds `only`), built where missing (run in a process
    of its own: see main)."""
    if what == "vocab":
        return {"xlmr-250k": str(_xlmr_250k(out))}
    if what in ("lms", "corrected"):
        real = {"135M SmolLM2": SMOLLM2, **{name: REPO / "runs" / "lm" / folder for name, folder in REAL_LMS.items()}}
        return {**{n: str(p) for n, p in real.items() if p.is_dir() and only in n}, **_lms(out, only)}
    return {
        "22M all-MiniLM-L6-v2": str(_default_model()),
        "110M BERT-base (random)": str(_bert_110m(out)),
        "135M SmolLM2": str(SMOLLM2),
        "1.07B Llama (random)": str(_llama_1b(out)),
    }


def _built(what: str, out: Path, only: str) -> dict[str, Path]:
    """_models in a child process, so that this one never holds a model: a measured process starts as a
    fork of this one, and its peak memory would count whatever this one held."""
    script = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import large_models as m; "
    script += f"print(json.dumps(m._models({what!r}, m.Path({str(out)!r}), {only!r})))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return {name: Path(path) for name, path in json.loads(done.stdout.splitlines()[-1]).items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("vocab", "sizes", "lms", "corrected"))
    p.add_argument("--out", type=Path, default=Path("runs/large"))
    p.add_argument("--again", action="store_true", help="measure again what OUT/large_models.json already holds")
    p.add_argument("--only", default="", help="measure only the models (lms) whose name holds this, e.g. Qwen")
    p.add_argument("--scheme", default="int4-corrected", choices=("int4-corrected", "int4-trained"), help="corrected")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    models = _built(args.what, args.out, args.only)
    if args.what in ("lms", "corrected"):
        chosen = {k: v for k, v in models.items() if args.only in k}
        if not chosen:
            p.error(f"--only {args.only!r} names none of the LMs here (the real ones need make lm and make lm-big)")
        return _run_lms(chosen, args.out, args.again, args.what, args.scheme)
    if args.what == "vocab":
        runs = {name: (models["xlmr-250k"], options.split()) for name, options in VOCAB_RUNS.items()}
    else:
        large = {"1.07B Llama (random)": ["--calib-passages", LARGE_CALIB_PASSAGES]}
        runs = {
            f"{name}, {fit}": (model, [*SIZE_PLAN, "--fit", fit, *large.get(name, [])])
            for name, model in models.items()
            for fit in ("plain", "aware")
        }
    results_path = args.out / "large_models.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, (model, options) in runs.items():
        if name in results and not args.again:
            continue
        result = measure(model, options, args.out / "compressed")
        results[name] = {"model": str(model), "options": options, **result}
        print(f"{name:45s} {result['seconds']:7.1f} s  {result['peak_gib']:5.2f} GiB peak", flush=True)
        results_path.write_text(json.dumps(results, indent=2))


def _run_lms(models: dict[str, Path], out: Path, again: bool, what: str, scheme: str) -> None:
    """`compressor run` (lms) or `compressor export --quantize SCHEME` (corrected: int4-corrected or int4-trained) on
    each LM, into OUT/large_lms.json or OUT/large_corrected.json."""
    results_path = out / f"large_{what}.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for name, model in models.items():
        key = f"{name}: {scheme}" if what == "corrected" else name
        if key in results and not again:
            continue
        if what == "corrected":
            result = measure_corrected(model, out / "corrected", scheme)
            command, peak = f"compressor export {model} --quantize {scheme}", result["peak_gib"]
        else:
            result = measure_run(model, out / "run")
            command, peak = f"compressor run {model}", result.get("stages", {}).get("peak_rss_bytes", 0) / 2**30
        results[key] = {"model": str(model), "command": command, **result}
        tree = f", {result['tree_peak_gib']:5.2f} GiB its processes together" if "tree_peak_gib" in result else ""
        print(f"{key:35s} {result['seconds']:7.1f} s  {peak:5.2f} GiB peak{tree}", flush=True)
        results_path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
