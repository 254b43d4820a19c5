"""A model folder's kind from what the folder says: a sentence-transformers folder (modules.json) is an encoder
whatever its architecture, where transformers builds its model as a bare model (AutoModel)."""

import json

import pytest

from compressor.errors import CompressorError
from converters.kinds import kind_for_config

GEMMA = {"architectures": ["Gemma3TextModel"], "model_type": "gemma3_text", "use_bidirectional_attention": True}
QWEN = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
]


@pytest.mark.parametrize(("config", "alone"), [(GEMMA, None), (QWEN, "causal-lm")])
def test_a_sentence_transformers_folder_is_an_encoder_whatever_its_architecture(tmp_path, config, alone):
    (tmp_path / "config.json").write_text(json.dumps(config))
    if alone is None:
        with pytest.raises(CompressorError, match="no kind takes"):
            kind_for_config(tmp_path)
    else:
        assert kind_for_config(tmp_path).name == alone
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    assert kind_for_config(tmp_path).name == "encoder"


def test_a_sentence_transformers_folder_of_an_encoder_decoder_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    with pytest.raises(CompressorError, match="no kind takes"):
        kind_for_config(tmp_path)
