"""A Press & Wolf–style LSTM language model, written as a user writes their own: a plain PyTorch
module that the toolkit has never seen (embedding → LSTM layers → dropout → output projection),
untied or tied (the projection's weight *is* the embedding's). `save` writes model.safetensors and
lstm_lm.json; `load` reads them back without pickles.

`tools/train_lm.py --arch lstm` trains it; `benchmarks/tie_lm.py runs/lm/lstm` ties, fine-tunes,
exports and benches it with the Python API, naming its modules ("embedding", "decoder")."""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from safetensors.torch import load_model, save_model
from torch import Tensor, nn

__all__ = ["LSTMConfig", "LSTMLM", "save", "load", "CONFIG_FILE"]

CONFIG_FILE = "lstm_lm.json"


@dataclass(frozen=True)
class LSTMConfig:
    vocab: int
    dim: int = 256  # embedding width = LSTM width, so that the two ends can be tied
    layers: int = 2
    dropout: float = 0.1
    tied: bool = False


class LSTMLM(nn.Module):
    """logits = decoder(dropout(LSTM(dropout(embedding(ids))))), (B, T) → (B, T, V)."""

    def __init__(self, cfg: LSTMConfig):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab, cfg.dim)
        self.lstm = nn.LSTM(
            cfg.dim, cfg.dim, cfg.layers, batch_first=True, dropout=cfg.dropout if cfg.layers > 1 else 0
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.decoder = nn.Linear(cfg.dim, cfg.vocab)
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)  # as PyTorch's word_language_model example
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if cfg.tied:
            self.decoder.weight = self.embedding.weight

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Right padding never reaches a real position of a left-to-right LSTM: the mask is not needed."""
        hidden, _ = self.lstm(self.dropout(self.embedding(input_ids)))  # (B, T, D)
        return self.decoder(self.dropout(hidden))  # (B, T, V)


def save(model: LSTMLM, out: Path) -> None:
    """model.safetensors (a tied table once) and lstm_lm.json in the folder `out`."""
    save_model(model, str(Path(out) / "model.safetensors"))
    (Path(out) / CONFIG_FILE).write_text(json.dumps(asdict(model.cfg), indent=2) + "\n")


def load(path: Path) -> LSTMLM:
    """The model saved in `path`, in eval mode."""
    model = LSTMLM(LSTMConfig(**json.loads((Path(path) / CONFIG_FILE).read_text())))
    load_model(model, str(Path(path) / "model.safetensors"))
    return model.eval()
