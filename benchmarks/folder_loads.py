"""Do the tools a user already runs load `compressor export`'s model folders as they are, and do they
embed the eval split as `compressor bench` does? Two steps, both in the toolkit's venv (its `dev` extra
holds Optimum for transformers 5, optimum-onnx-naf), the second runnable in any venv with
sentence-transformers, Optimum and onnxruntime (and no compressor):

    python benchmarks/folder_loads.py reference FOLDER... --out ref.npz
    python benchmarks/folder_loads.py load ref.npz

`reference` writes the eval split's passages and, per folder, the embeddings the bench computes from
its graph (mean of last_hidden_state over real tokens, unit rows, 128 tokens at most); `load` embeds
the same passages with SentenceTransformer(folder, backend="onnx") and with Optimum's
ORTModelForFeatureExtraction from the folder, each fed the bench's batches of 32 (a dynamic int8 graph
scales its activations per batch), and prints each one's mean and smallest cosine to the
bench's rows.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

MAX_TOKENS = 128  # the bench's truncation (texts.tokens.encode_passages)


def reference(folders: list[Path], out: Path) -> None:
    from eval.graph import make_session
    from eval.kinds import ENCODER
    from texts.tokens import encode_passages, load_tokenizer

    passages, where = ENCODER.passages(None, "eval")
    arrays = {"passages": np.array(passages, dtype=object)}
    for folder in folders:
        (graph,) = sorted((folder / "onnx").glob("*.onnx"))
        batches = encode_passages(load_tokenizer(folder), passages, MAX_TOKENS)
        arrays[str(folder)] = ENCODER.represent(make_session(graph), batches)
        arrays[f"{folder}:graph"] = np.array(str(graph.relative_to(folder)))
    np.savez(out, **arrays)
    print(f"{len(passages)} passages of {where}; wrote {out}")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def load(ref: Path) -> None:
    import torch
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    torch.set_num_threads(2)
    data = np.load(ref, allow_pickle=True)
    passages = list(data["passages"])
    rows = []
    for key in data.files:
        if key == "passages" or key.endswith(":graph"):
            continue
        folder, graph = Path(key), str(data[f"{key}:graph"])
        st = SentenceTransformer(str(folder), backend="onnx", model_kwargs={"file_name": graph})
        st.max_seq_length = MAX_TOKENS
        by_st = np.concatenate([st.encode(passages[s : s + 32], batch_size=32) for s in range(0, len(passages), 32)])
        model = ORTModelForFeatureExtraction.from_pretrained(folder, subfolder="onnx", file_name=Path(graph).name)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        by_optimum = []
        for start in range(0, len(passages), 32):
            enc = tokenizer(
                passages[start : start + 32], padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
            )
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"][..., None].float()
            by_optimum.append(((hidden * mask).sum(1) / mask.sum(1)).detach().numpy())
        for tool, emb in (("sentence-transformers", by_st), ("optimum", np.concatenate(by_optimum))):
            cos = _cosines(data[key], emb)
            rows.append(
                {
                    "folder": key,
                    "graph": graph,
                    "tool": tool,
                    "mean_cosine": float(cos.mean()),
                    "min_cosine": float(cos.min()),
                }
            )
    print(json.dumps(rows, indent=1))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="step", required=True)
    r = sub.add_parser("reference")
    r.add_argument("folders", nargs="+", type=Path)
    r.add_argument("--out", type=Path, required=True)
    lo = sub.add_parser("load")
    lo.add_argument("ref", type=Path)
    args = p.parse_args(argv)
    if args.step == "reference":
        reference(args.folders, args.out)
    else:
        load(args.ref)


if __name__ == "__main__":
    main(sys.argv[1:])
