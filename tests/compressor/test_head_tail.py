import pytest
import torch
from torch import nn

from compressor.errors import ShapeError
from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tt_embedding import TTEmbedding

TAILS = {
    "lowrank": lambda w, ids: LowRankEmbedding.from_weight(w, 3),
    "tt": lambda w, ids: TTEmbedding.from_weight(w, rank=2),
}


@pytest.mark.parametrize("tail", TAILS)
def test_head_rows_are_bit_exact_and_tail_rows_come_from_the_tail(tail):
    torch.manual_seed(0)
    emb = nn.Embedding(120, 12)
    head = torch.tensor([7, 0, 119, 42])
    module = HeadTailEmbedding.from_embedding(emb, head, TAILS[tail])
    assert torch.equal(module(head), emb.weight[head])
    ids = torch.arange(120).reshape(4, 30)
    assert torch.allclose(module(ids), module.to_dense()[ids], atol=1e-6)
    tail_ids = torch.tensor([1, 2, 118])
    assert not torch.allclose(module(tail_ids), emb.weight[tail_ids], atol=1e-3)  # compressed


def test_bad_head_tokens_raise():
    emb = nn.Embedding(10, 4)
    with pytest.raises(ShapeError, match="distinct"):
        HeadTailEmbedding.from_embedding(emb, torch.tensor([1, 1]), TAILS["lowrank"])
    with pytest.raises(ShapeError, match="distinct ids in"):
        HeadTailEmbedding.from_embedding(emb, torch.tensor([3, 10]), TAILS["lowrank"])
