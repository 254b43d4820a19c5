"""Tiny in-file models: a randomly initialised BERT, Llama and GPT-2 saved as Hugging Face directories."""

import string
from pathlib import Path

import numpy as np
import pytest
import torch

WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "of",
    "to",
    "in",
    "and",
    "or",
    "not",
    "for",
    "with",
    "as",
    "def",
    "class",
    "return",
    "import",
    "from",
    "if",
    "else",
    "while",
    "loop",
    "list",
    "dict",
    "string",
    "value",
    "object",
    "module",
    "function",
    "method",
    "python",
    "statement",
]


def write_tiny_bert(path: Path, seed: int = 0, hidden: int = 48, intermediate: int = 96) -> Path:
    from transformers import BertConfig, BertModel, BertTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab += [f"##{c}" for c in string.ascii_lowercase] + WORDS
    path.mkdir(parents=True, exist_ok=True)
    BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=intermediate,
        max_position_embeddings=160,  # room for the (8, 128) batch of the memory probe
    )
    BertModel(config).eval().save_pretrained(path)
    return path


def matmul_graph(weight):
    """The ONNX graph y = x W of one MatMul named "mm", its weight (K × N) the initializer "W"."""
    from onnx import TensorProto, helper, numpy_helper

    k, n = weight.shape
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(weight, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def gather_graph(rows: int, cols: int):
    """(the ONNX graph rows = Gather(table, input_ids) of a random (rows, cols) table "table", its one node
    named, opset 21; the table)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    table = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["rows"], name="lookup")],
        "lookup",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch", "length", cols])],
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), table


GEMMA_WINDOW = 4  # the tiny Gemma 3's local layers' window: its tests decode past it


def write_tiny_lm(
    path: Path, arch: str = "llama", tied: bool = True, seed: int = 0, hidden: int = 48, head_dim: int = 32
) -> Path:
    """A causal LM of `arch` (llama: RMSNorm, SwiGLU, rotary, grouped-query attention; gpt2: Conv1D,
    learned positions; gemma3: Gemma 3's text LM, heads of `head_dim`, 4 query heads on 1 key-value head, two
    layers attending to a window of 4 positions and one to the whole past, its norms' weights drawn away from 0)
    with a word-level tokenizer over WORDS, characters and <|endoftext|>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    vocab = ["<|endoftext|>", "<unk>", *WORDS, *(string.ascii_lowercase + string.digits + string.punctuation)]
    vocab = list(dict.fromkeys(vocab))
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    special = "<|endoftext|>"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=special, eos_token=special, pad_token=special, unk_token="<unk>"
    )
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    torch.manual_seed(seed)
    ids = {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "tie_word_embeddings": tied}
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=len(vocab),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=160,
            **ids,
        )
        model = LlamaForCausalLM(config)
    elif arch == "gemma3":
        config = Gemma3TextConfig(
            vocab_size=len(vocab),
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=head_dim,
            sliding_window=GEMMA_WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            query_pre_attn_scalar=head_dim,
            max_position_embeddings=160,
            **ids,
        )
        model = Gemma3ForCausalLM(config)
        with torch.no_grad():  # Gemma's norms scale by 1 + w, w = 0 when made: drawn, so that a lost 1 shows
            for name, weight in model.named_parameters():
                if name.endswith("norm.weight"):
                    weight.normal_(0.0, 0.5)
    else:
        config = GPT2Config(vocab_size=len(vocab), n_embd=48, n_layer=2, n_head=4, n_positions=160, **ids)
        model = GPT2LMHeadModel(config)
    model.eval().save_pretrained(path)
    return path


@pytest.fixture(autouse=True, scope="session")
def _small_fit_text():
    """The default fit text of pydoc's paragraphs and the json package's docstrings, for the runs that read it: the
    whole text (the standard library's, numpy's, scipy's and matplotlib's docstrings, Wikipedia's articles) takes
    15–20 s to build in each process and its counts and windows seconds a run; tests/texts/test_corpus.py checks
    that one (real_fit_text)."""
    import json

    from texts.docstrings import Source

    small = [Source("the json package", Path(json.__file__).parent)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("texts.corpus.docstring_sources", lambda: small)
        patch.setattr("texts.corpus.wiki_name", lambda: None)
        yield


@pytest.fixture
def real_fit_text(monkeypatch):
    """The default fit text as a run builds it, for the tests of that text (the suite's is _small_fit_text's)."""
    from texts import corpus, docstrings, wiki

    monkeypatch.setattr(corpus, "docstring_sources", docstrings.docstring_sources)
    monkeypatch.setattr(corpus, "wiki_name", wiki.wiki_name)
    corpus._fit_text.cache_clear()
    yield
    corpus._fit_text.cache_clear()


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path_factory, monkeypatch):
    """No test writes to the user's cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


def _probe_in_process(path: Path, batch: int, seq: int, vocab: int, no_model: bool, decode: int = 0) -> dict:
    """eval.memory's probe without its fresh process (~0.25 s of imports each, two a row): the graph's files and
    an activation's bytes over a fixed baseline, ordered as the real probe orders them by size."""
    base = 40 * 2**20
    weights = 0 if no_model else sum(p.stat().st_size for p in Path(path).parent.glob(f"{Path(path).name}*"))
    stages = {"session": base + weights, "b1_s16": base + weights + 16 * 4096}
    if not no_model:
        key, tokens = (f"b1_s{seq}_decode{decode}", seq) if decode else (f"b{batch}_s{seq}", batch * seq)
        stages[key] = base + weights + tokens * 4096
    peak = max(stages.values()) if not no_model else base
    return {"peak_rss_bytes": peak, "stages": {k: {"peak_bytes": v, "rss_bytes": v} for k, v in stages.items()}}


@pytest.fixture(autouse=True)
def _memory_probe(request, monkeypatch):
    """A run's peak RSS is measured in fresh processes (eval.memory): the tests of that probe (marked `memory`) run
    it; the others, which check what a run writes and not what it measures, take _probe_in_process."""
    if request.node.get_closest_marker("memory") is None:
        monkeypatch.setattr("eval.memory._probe", _probe_in_process)


def _bare_png(report: dict, path: Path, x: str = "file_bytes", quality: str | None = None) -> Path:
    """eval.plot.plot_front's file without its drawing (about 0.6 s a plot, three a run): the PNG signature alone."""
    Path(path).write_bytes(b"\x89PNG\r\n\x1a\n")
    return Path(path)


@pytest.fixture(autouse=True)
def _plots(request, monkeypatch):
    """A run draws its fronts with matplotlib: the tests that check the drawing (marked `plots`, and eval.plot's own)
    draw them; the others, which check what a run measures and writes, take _bare_png."""
    if request.node.get_closest_marker("plots") is None:
        monkeypatch.setattr("converters.pipeline.rows.plot_front", _bare_png)


@pytest.fixture(scope="module")
def tiny_bert_graph(tmp_path_factory) -> tuple[Path, int, list[dict]]:
    """A tiny BERT's fp32 graph, its vocabulary and four calibration batches of random ids (8 × 12)."""
    from converters.checkpoint import load_model
    from converters.export import export_onnx, sample_inputs

    path = write_tiny_bert(tmp_path_factory.mktemp("bert") / "bert", hidden=64, intermediate=128)
    model, _ = load_model(path)
    vocab = model.get_input_embeddings().num_embeddings
    names = ("input_ids", "attention_mask")
    feeds = [dict(zip(names, (x.numpy() for x in sample_inputs(vocab, 8, 12, seed)))) for seed in range(4)]
    return export_onnx(model, path.parent / "m.onnx").path, vocab, feeds


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert")


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of the command line given `argv`."""
    from converters.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


GENAI_PROMPT = (3, 17, 5, 42, 8, 11)


def genai_greedy(folder: Path, steps: int) -> tuple[np.ndarray, list[int]]:
    """(the prompt GENAI_PROMPT as int64 ids, the `steps` tokens ONNX Runtime GenAI's generator decodes greedily after
    it from the model folder `folder`)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    prompt = np.array(GENAI_PROMPT, dtype=np.int32)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + steps, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    return prompt.astype(np.int64), list(generator.get_sequence(0))[len(prompt) :]


@pytest.fixture(scope="session")
def lm_text(tmp_path_factory) -> Path:
    """Passages of WORDS, one a line, for the LM commands' calibration, fine-tune and eval text."""
    lines = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 12)) for i in range(1, 40)]
    path = tmp_path_factory.mktemp("lm") / "text.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def eval_text_file(tmp_path_factory) -> Path:
    lines = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 9)) for i in range(1, 25)]
    path = tmp_path_factory.mktemp("text") / "eval.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory) -> Path:
    return write_tiny_lm(tmp_path_factory.mktemp("tiny") / "gpt2", "gpt2")


ST_ROWS = 262_144  # EmbeddingGemma's table; its tokenizer holds one more entry, an image token text never produces
IMAGE_TOKEN = "<image_soft_token>"


def write_st_encoder(path: Path, arch: str = "gemma3", hidden: int = 16, seed: int = 0) -> Path:
    """A sentence-transformers folder saved by sentence-transformers itself, its table of ST_ROWS rows of width
    `hidden` and its word-level tokenizer of ST_ROWS entries (WORDS, characters, fillers) and IMAGE_TOKEN beyond
    them. gemma3: EmbeddingGemma's shape (a bidirectional Gemma 3 of 2 layers, one attending to a window of 4
    positions; mean Pooling, Dense hidden → 4·hidden → hidden without bias or activation, Normalize); xlm-roberta:
    an XLM-R of 1 layer, CLS Pooling, a Dense to hidden / 2 with bias and Tanh, Normalize."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import (
        Gemma3TextConfig,
        Gemma3TextModel,
        PreTrainedTokenizerFast,
        XLMRobertaConfig,
        XLMRobertaModel,
    )

    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = list(dict.fromkeys([*specials, *WORDS, *(string.ascii_lowercase + string.digits + string.punctuation)]))
    vocab += [f"filler{i}" for i in range(ST_ROWS - len(vocab))]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 1)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})  # id ST_ROWS, beyond the table
    model_dir = path.parent / f"{path.name}-transformer"
    tokenizer.save_pretrained(model_dir)
    torch.manual_seed(seed)
    ids = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if arch == "gemma3":
        config = Gemma3TextConfig(
            vocab_size=ST_ROWS,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=GEMMA_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=8,
            max_position_embeddings=160,
            use_bidirectional_attention=True,
            **ids,
        )
        model = Gemma3TextModel(config)
        with torch.no_grad():  # Gemma's norms scale by 1 + w, w = 0 when made: drawn, so that a lost 1 shows
            for name, weight in model.named_parameters():
                if name.endswith("norm.weight"):
                    weight.normal_(0.0, 0.5)
        heads = [
            Pooling(hidden, "mean"),
            Dense(hidden, 4 * hidden, bias=False, activation_function=None),
            Dense(4 * hidden, hidden, bias=False, activation_function=None),
        ]
    else:
        config = XLMRobertaConfig(
            vocab_size=ST_ROWS,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=162,
            **ids,
        )
        model = XLMRobertaModel(config, add_pooling_layer=False)
        heads = [Pooling(hidden, "cls"), Dense(hidden, hidden // 2)]
    model.eval().save_pretrained(model_dir)
    st = SentenceTransformer(
        modules=[Transformer(str(model_dir), max_seq_length=128), *heads, Normalize()], device="cpu"
    )
    st.save(str(path))
    return path
