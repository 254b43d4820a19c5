"""The fine-tune under torchrun's processes: two gloo processes, each on its half of a batch, give the
gradients one process gives on the whole batch (DistributedDataParallel averages them, FSDP reduces
them to each one's shard; the loss is a mean over examples), and a fine-tune on two processes runs its
steps in step, ending with the same weights on both (rank 0 alone evaluating; under FSDP both do, and
end where DistributedDataParallel does)."""

import math
import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor

from compressor.errors import CompressorError
from converters.checkpoint import load_model
from converters.compress import compress_
from converters.distributed import Shards, process_group, wrap
from converters.finetune import Distillation, FinetuneRun, finetune_, trainable_parameters
from converters.finetune.config import FinetuneConfig
from converters.finetune.loss import step_loss
from converters.kinds.encoder import ENCODER
from converters.methods.tt import TTConfig
from converters.plan import Plan
from converters.registry import compact_modules
from converters.torchrun import world
from texts.tokens import load_tokenizer

TEXTS = [f"the {w} value of a list is a string in python module number {i}" for i, w in enumerate("abcdefgh" * 4)]
COMPACT = tuple(compact_modules().values())
COSINE_ONLY = FinetuneConfig(  # every weight trained, the layers' blocks (FSDP's units) too
    steps=6,
    seconds=None,
    lr=1e-2,
    rest_lr=1e-3,
    batch_size=8,
    eval_every=3,
    hidden_weight=0,
    layer_weight=0,
    trainable="all",
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


def _gradients(student, teacher, ids, mask, sharded=False) -> dict[str, torch.Tensor]:
    """Each trained parameter's whole gradient, under DistributedDataParallel or FSDP (`sharded`)."""
    trainable_parameters(student, COSINE_ONLY.trainable, COMPACT)
    model = wrap(student, torch.device("cpu"), sharded)
    params = dict((model.module if isinstance(model, Shards) else student).named_parameters())
    step_loss(ENCODER, model, teacher, ids, mask, COSINE_ONLY).backward()
    whole = {k: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad for k, p in params.items()}
    return {k: g.clone() for k, g in whole.items() if g is not None}


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    student, teacher, tokenizer = _pair(model_dir)
    ids, mask = _batch(tokenizer)
    half = slice(4 * rank, 4 * rank + 4)
    with process_group(torch.device("cpu")):  # one group throughout: a second one could meet the first's rendezvous
        result = {
            "grads": _gradients(student, teacher, ids[half], mask[half]),
            "sharded_grads": _gradients(*_pair(model_dir)[:2], ids[half], mask[half], sharded=True),
        }
        for sharded in (False, True):
            student, teacher, tokenizer = _pair(model_dir)
            report = finetune_(
                Distillation(student, teacher, tokenizer, TEXTS, TEXTS[:8], COMPACT),
                COSINE_ONLY,
                FinetuneRun(progress=False, sharded=sharded),
            )
            result["sharded" * sharded + "report"] = report.to_dict()
            result["sharded" * sharded + "weights"] = student.state_dict()
    torch.save(result, f"{out}/{rank}.pt")


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
    floor = 1e-6 * max(float(g.abs().max()) for g in alone.values())  # a key's bias: 0 but for rounding
    for result in two_processes:  # each process holds the averaged gradient, under FSDP gathered from its shards
        for held in (result["grads"], result["sharded_grads"]):
            assert set(held) == set(alone)
            for name, grad in alone.items():
                assert torch.allclose(held[name], grad, rtol=1e-4, atol=floor), name


def test_a_fine_tune_on_two_processes_stays_in_step(two_processes):
    first, second = two_processes
    assert first["report"]["steps"] == second["report"]["steps"] == 6
    assert first["report"]["best_val_cosine"] > first["report"]["start_val_cosine"]  # rank 0 evaluates
    assert math.isnan(second["report"]["start_val_cosine"])  # and it alone
    assert all(torch.allclose(first["weights"][k], second["weights"][k], atol=1e-6) for k in first["weights"])


def test_a_sharded_fine_tune_ends_where_the_replicated_one_does(two_processes):
    first, second = two_processes
    assert first["shardedreport"]["steps"] == second["shardedreport"]["steps"] == 6
    assert first["shardedreport"]["best_val_cosine"] > first["shardedreport"]["start_val_cosine"]
    assert second["shardedreport"]["start_val_cosine"] == first["shardedreport"]["start_val_cosine"]  # both evaluate
    for name, weight in first["weights"].items():  # the whole weights back on both processes, as DDP's
        scale = 1e-5 * max(1.0, float(weight.abs().max()))
        assert torch.allclose(first["shardedweights"][name], second["shardedweights"][name], atol=scale)
        assert torch.allclose(first["shardedweights"][name], weight, atol=scale), name


@pytest.mark.parametrize("batch, texts, shared", [(2, 8, "2 windows in a batch"), (8, 3, "3 windows in the fine-tune")])
def test_more_processes_than_windows_are_refused(tiny_bert_dir, monkeypatch, batch, texts, shared):
    student, teacher, tokenizer = _pair(tiny_bert_dir)
    monkeypatch.setenv("WORLD_SIZE", "4")  # refused before any process group is sought
    cfg = replace(COSINE_ONLY, batch_size=batch)
    with pytest.raises(CompressorError, match=f"4 processes cannot share {shared}"):
        finetune_(
            Distillation(student, teacher, tokenizer, TEXTS[:texts], TEXTS[:4], COMPACT),
            cfg,
            FinetuneRun(progress=False),
        )
