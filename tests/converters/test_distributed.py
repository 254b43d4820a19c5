"""The fine-tune under torchrun's processes: two gloo processes, each on its half of a batch, give the
gradients one process gives on the whole batch (DistributedDataParallel averages them; the loss is a
mean over examples), and a fine-tune on two processes runs its steps in step, ending with the same
weights on both, rank 0 alone evaluating."""

import math
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from converters.checkpoint import load_model
from converters.compress import compress_
from converters.distributed import process_group, world, wrap
from converters.finetune import FinetuneConfig, finetune_, trainable_parameters
from converters.finetune_loss import step_loss
from converters.kinds.encoder import ENCODER
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import compact_modules
from texts.tokens import load_tokenizer

TEXTS = [f"the {w} value of a list is a string in python module number {i}" for i, w in enumerate("abcdefgh" * 4)]
COMPACT = tuple(compact_modules().values())
COSINE_ONLY = FinetuneConfig(
    steps=6, seconds=None, lr=1e-2, batch_size=8, eval_every=3, hidden_weight=0, layer_weight=0
)


def _pair(model_dir):
    teacher, source = load_model(model_dir)
    student, _ = load_model(model_dir)
    compress_(student, Plan((("embeddings", TTConfig(rank=2, order="none")),)), progress=False)
    return student, teacher, load_tokenizer(source)


def _batch(tokenizer):
    """8 windows of equal length (no padding): the first four are rank 0's half, the last four rank 1's."""
    ids = tokenizer(TEXTS[:8], return_tensors="pt", padding=True)
    return ids["input_ids"], ids["attention_mask"]


def _gradients(student, teacher, ids, mask) -> dict[str, torch.Tensor]:
    params = dict(student.named_parameters())
    trainable_parameters(student, "compressed", COMPACT)
    model = wrap(student, torch.device("cpu"))
    step_loss(ENCODER, model, teacher, ids, mask, COSINE_ONLY).backward()
    return {k: p.grad.clone() for k, p in params.items() if p.grad is not None}


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    student, teacher, tokenizer = _pair(model_dir)
    ids, mask = _batch(tokenizer)
    half = slice(4 * rank, 4 * rank + 4)
    with process_group(torch.device("cpu")):
        grads = _gradients(student, teacher, ids[half], mask[half])
    student, teacher, tokenizer = _pair(model_dir)
    report = finetune_(student, teacher, tokenizer, TEXTS, TEXTS[:8], COSINE_ONLY, COMPACT, progress=False)
    torch.save({"grads": grads, "report": report.to_dict(), "weights": student.state_dict()}, f"{out}/{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_processes(tiny_bert_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(_worker, args=(_free_port(), str(tiny_bert_dir), str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"{rank}.pt", weights_only=True) for rank in range(2)]


def test_two_processes_give_the_gradient_of_the_whole_batch(tiny_bert_dir, two_processes):
    student, teacher, tokenizer = _pair(tiny_bert_dir)
    alone = _gradients(student, teacher, *_batch(tokenizer))
    assert alone and world().size == 1
    for result in two_processes:  # each process holds the averaged gradient
        assert set(result["grads"]) == set(alone)
        for name, grad in alone.items():
            assert torch.allclose(result["grads"][name], grad, rtol=1e-4, atol=1e-6 * float(grad.abs().max()))


def test_a_fine_tune_on_two_processes_stays_in_step(two_processes):
    first, second = two_processes
    assert first["report"]["steps"] == second["report"]["steps"] == 6
    assert first["report"]["best_val_cosine"] > first["report"]["start_val_cosine"]  # rank 0 evaluates
    assert math.isnan(second["report"]["start_val_cosine"])  # and it alone
    assert all(torch.allclose(first["weights"][k], second["weights"][k], atol=1e-6) for k in first["weights"])
