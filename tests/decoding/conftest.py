"""The ready folders of tiny causal LMs that the decoding tests read, exported once for the package."""

import pytest

from converters.checkpoint import load_model
from tests.conftest import write_tiny_lm


@pytest.fixture(scope="package", params=["llama", "gpt2", "llama-fused", "gemma3", "gemma3-fused"])
def lm_folder(request, tiny_llama_dir, tiny_gpt2_dir, tmp_path_factory):
    """(the model, its ready folder from `compressor export`) for a tiny Llama and a tiny GPT-2, traced, a
    tiny Llama whose heads of 16 dimensions GroupQueryAttention takes: the fused decoder's graph, and a tiny
    Gemma 3 whose local layers attend to a window of 4 positions, traced (heads of 24) and fused (of 32)."""
    from converters.cli import main

    def tiny(arch: str, **shape):
        return lambda: write_tiny_lm(tmp_path_factory.mktemp("lm") / arch, arch, hidden=64, **shape)

    source = {
        "llama": lambda: tiny_llama_dir,
        "gpt2": lambda: tiny_gpt2_dir,
        "llama-fused": tiny("llama"),
        "gemma3": tiny("gemma3", head_dim=24),
        "gemma3-fused": tiny("gemma3", head_dim=32),
    }[request.param]()
    out = tmp_path_factory.mktemp("lm") / request.param
    assert main(["export", str(source), "--out", str(out)]) == 0
    return load_model(source)[0], out
