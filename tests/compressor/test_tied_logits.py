"""Logits through a compact table's factors: h Wᵀ without forming W, and a tied head that owns no weight."""

import onnx
import pytest
import torch
from torch import nn

from compressor.head_tail import HeadTailEmbedding
from compressor.lowrank_embedding import LowRankEmbedding
from compressor.tied_logits import TiedLogits, matmul_t
from compressor.tt_embedding import TTEmbedding

torch.manual_seed(0)
TABLE = torch.randn(101, 12, dtype=torch.float64)


def _tail(weight, ids):
    return LowRankEmbedding.from_weight(weight, 4)


TABLES = {
    "lowrank": lambda: LowRankEmbedding.from_weight(TABLE, 5),
    "tt": lambda: TTEmbedding.from_weight(TABLE, rank=8),
    "tt-pca-order": lambda: TTEmbedding.from_weight(TABLE, rank=8, order="pca"),
    "tt-3-cores": lambda: TTEmbedding.from_weight(TABLE, rank=4, num_cores=3),
    "head-tail": lambda: HeadTailEmbedding.from_embedding(nn.Embedding.from_pretrained(TABLE), [3, 50, 7], _tail),
    "head-tt-tail": lambda: HeadTailEmbedding.from_embedding(
        nn.Embedding.from_pretrained(TABLE), [0, 100], lambda w, ids: TTEmbedding.from_weight(w, rank=6)
    ),
}


@pytest.mark.parametrize("name", TABLES)
def test_logits_through_the_factors_equal_h_times_the_formed_table(name):
    table = TABLES[name]()
    h = torch.randn(3, 5, 12, dtype=torch.float64)
    expected = h @ table.to_dense().T
    assert table.logits(h).shape == (3, 5, 101)
    torch.testing.assert_close(table.logits(h), expected, rtol=1e-10, atol=1e-10)


def test_the_tied_head_owns_no_weight_and_follows_the_table():
    table = LowRankEmbedding.from_weight(TABLE, 5)
    head = TiedLogits(table)
    assert list(head.parameters()) == [] and head.state_dict() == {}
    h = torch.randn(4, 12, dtype=torch.float64)
    torch.testing.assert_close(head(h), h @ table.to_dense().T, rtol=1e-4, atol=1e-5)
    dense = nn.Embedding.from_pretrained(TABLE)
    torch.testing.assert_close(TiedLogits(dense)(h), h @ TABLE.T, rtol=1e-4, atol=1e-5)


class _Tied(nn.Module):
    """An embedding and a head over the same table, as a tied LM has them."""

    def __init__(self, table: nn.Module):
        super().__init__()
        self.table = table
        self.head = TiedLogits(table)

    def forward(self, ids):
        return self.head(self.table(ids))


@pytest.mark.parametrize(
    "make", [lambda: nn.Embedding(101, 12), lambda: LowRankEmbedding.from_weight(TABLE.float(), 5)], ids=["dense", "lr"]
)
def test_an_exported_tied_head_stores_each_weight_once(tmp_path, make):
    """The exporter folds Wᵀ into a second, transposed initializer unless the head is a FusedMatMul with transB."""
    model = _Tied(make()).eval()
    path = tmp_path / "tied.onnx"
    ids = torch.tensor([[1, 2, 3]])
    torch.onnx.export(model, (ids,), str(path), dynamo=False, opset_version=17, input_names=["ids"])
    graph = onnx.load(str(path)).graph
    sizes = sorted(tuple(i.dims) for i in graph.initializer if len(i.dims) == 2)
    expected = sorted(tuple(p.shape) for p in model.parameters())
    assert sizes == expected
    assert any(n.op_type == "FusedMatMul" for n in graph.node)


def test_matmul_t_outside_export_is_a_plain_product():
    x, w = torch.randn(2, 3, 4), torch.randn(5, 4)
    torch.testing.assert_close(matmul_t(x, w), x @ w.T, rtol=1e-4, atol=1e-5)
