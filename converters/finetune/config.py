"""The fine-tune's settings (FinetuneConfig: budgets, learning rates, losses, batches, where it runs),
checked when made, and what a fine-tune reports (FinetuneReport: steps, time, agreement, why it
stopped, throughput)."""

from dataclasses import asdict, dataclass, field, replace

import torch

from compressor.errors import CompressorError
from converters.kinds import ModelKind

__all__ = ["FinetuneConfig", "FinetuneReport", "SCHEDULES", "TRAINABLE", "DEVICES"]

TRAINABLE = ("compressed", "all")
DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("constant", "linear")


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int | None = None  # stop after this many steps …
    seconds: float | None = 300.0  # … or this much wall time, whichever comes first
    lr: float = 2e-3  # of the compressed tables' parameters
    linear_lr: float = 2e-4  # of the compressed linear layers' factors
    rest_lr: float = 1e-4  # of the others, with trainable="all": they start trained, so smaller steps
    schedule: str = "linear"  # warm up over warmup_steps, then decay to 0 at the budget's end; or "constant"
    warmup_steps: int = 20
    batch_size: int | None = None  # None: the model kind's (an encoder 32 passages, a language model 8)
    max_length: int = 64
    trainable: str = "compressed"
    cosine_weight: float = 1.0  # encoders: of 1 − cos of the pooled embeddings
    hidden_weight: float = 1.0  # encoders: of the last hidden state's relative squared error
    temperature: float = 1.0  # language models: τ of the KL between next-token distributions
    layer_weight: float = 1.0  # per-layer hidden-state matching
    rare_share: float = 0.0  # the share of windows drawn by rarity rather than uniformly
    synthetic: float = 0.0  # the share of each batch made of token sequences drawn from the prior
    eval_every: int = 50
    seed: int = 0
    device: str = "auto"  # cuda when present, else the CPU; or "cpu", "cuda"

    def __post_init__(self):
        if self.steps is None and self.seconds is None:
            raise CompressorError("a fine-tune needs a step budget, a time budget, or both")
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 0):
            raise CompressorError(f"fine-tune steps must be ≥ 0, got {self.steps!r}")
        if self.seconds is not None and self.seconds <= 0:
            raise CompressorError(f"a fine-tune time budget must be > 0 seconds, got {self.seconds!r}")
        if self.trainable not in TRAINABLE:
            raise CompressorError(f"trainable must be one of {', '.join(TRAINABLE)}, got {self.trainable!r}")
        if self.schedule not in SCHEDULES:
            raise CompressorError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        rates = (self.lr, self.linear_lr, self.rest_lr)
        sizes = (1 if self.batch_size is None else self.batch_size, self.max_length - 1, self.eval_every)
        if not all(r > 0 for r in (*rates, *sizes, self.temperature)):
            raise CompressorError(
                "learning rates, batch size, length, interval and temperature must be positive, got lr "
                f"{self.lr:g}, linear_lr {self.linear_lr:g}, rest_lr {self.rest_lr:g}, batch size {self.batch_size}, "
                f"length {self.max_length}, interval {self.eval_every}, temperature {self.temperature:g}"
            )
        for name in ("rare_share", "synthetic"):
            if not 0 <= (value := getattr(self, name)) <= 1:
                raise CompressorError(f"the fine-tune's {name.replace('_', ' ')} must lie in [0, 1], got {value!r}")
        self.check_synthetic(self.batch_size or 10**9)  # any batch: a share of 1 leaves no text
        if self.layer_weight < 0:
            raise CompressorError(f"the per-layer matching weight must be ≥ 0, got {self.layer_weight!r}")
        if self.device not in DEVICES:
            raise CompressorError(f"the fine-tune's device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise CompressorError(
                "--device cuda: PyTorch sees no GPU on this machine; leave it out to train on the CPU"
            )

    def check_synthetic(self, batch: int) -> None:
        """The synthetic share leaves text in a batch of `batch` passages."""
        if round(self.synthetic * batch) >= batch:
            size = f"a batch of {batch}" if batch < 10**9 else "any batch"
            raise CompressorError(
                f"--synthetic {self.synthetic:g} leaves no text in {size}; give less than {(batch - 0.5) / batch:.3f}"
            )

    def with_batch(self, kind: ModelKind) -> "FinetuneConfig":
        """This config with its batch size, the kind's default when none was given."""
        if self.batch_size is not None:
            return self
        self.check_synthetic(kind.finetune_batch)
        return replace(self, batch_size=kind.finetune_batch)


@dataclass
class FinetuneReport:
    device: str
    steps: int = 0
    seconds: float = 0.0
    trainable_params: int = 0
    best_step: int = 0
    best_val_cosine: float = float("nan")
    start_val_cosine: float = float("nan")
    losses: list[float] = field(default_factory=list)  # mean loss per eval interval
    stopped: str = ""  # why it stopped early (NaN loss, interrupt), empty otherwise
    tokens: int = 0  # the real tokens of the windows trained on, every process's (this one's × their number)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        rates = {
            "steps_per_second": round(self.steps_per_second, 3),
            "tokens_per_second": round(self.tokens_per_second),
        }
        return {**asdict(self), **rates}
