import pytest
import torch
from torch import nn

from compressor.errors import PlanError, RankError
from compressor.tt_embedding import TTEmbedding
from converters.compress import compress_
from converters.methods.tt import TTConfig
from converters.plan import Plan, match_plan


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(120, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.other_embed = nn.Embedding(50, 8)

    def get_input_embeddings(self):
        return self.embed


def test_plan_json_round_trip():
    plan = Plan((("embed", TTConfig(rank=8, order="none")), ("re:other.*", TTConfig(rel_eps=0.1, rank=None))))
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    "target, expected",
    [
        ("embed", ["embed"]),
        ("embeddings", ["embed"]),
        ("re:.*embed", ["embed", "other_embed"]),
        ("other_embed", ["other_embed"]),
    ],
)
def test_targets_match_by_name_keyword_and_regex(target, expected):
    assert sorted(match_plan(Plan(((target, TTConfig()),)), Tiny())) == expected


def test_a_missing_module_is_named_with_the_closest_names():
    with pytest.raises(PlanError, match="no such module; closest names: embed"):
        match_plan(Plan((("embedd", TTConfig()),)), Tiny())


@pytest.mark.parametrize(
    "data, message",
    [
        ({"version": 1, "entries": [{"target": "embed", "method": "zip"}]}, "unknown method 'zip'"),
        ({"version": 1, "entries": [{"target": "embed", "method": "tt", "config": {"rnk": 3}}]}, "no option"),
        ({"version": 7, "entries": []}, "version"),
        ({"version": 1, "entries": []}, "at least one entry"),
    ],
)
def test_bad_plan_files_raise(data, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_dict(data)


@pytest.mark.parametrize("config", [[1, 2], "x"])
def test_a_config_that_is_no_object_is_one_sentence(config):
    entry = {"target": "linear", "method": "lowrank", "config": config}
    with pytest.raises(PlanError, match="its config is an object of lowrank options"):
        Plan.from_dict({"version": 1, "entries": [entry]})


def test_plan_file_that_is_not_json_raises():
    with pytest.raises(PlanError, match="must be JSON"):
        Plan.from_json("{not json")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"rank": 0}, RankError),
        ({"rank": None}, PlanError),
        ({"order": "zigzag"}, PlanError),
        ({"num_cores": 1}, PlanError),
        ({"fit": "weighted"}, PlanError),  # plain, aware or fisher
    ],
)
def test_bad_configs_raise(kwargs, error):
    with pytest.raises(error):
        TTConfig(**kwargs)


def test_unsupported_module_raises_before_anything_changes():
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = Plan((("embed", TTConfig(rank=4)), ("blocks.0", TTConfig(rank=4))))
    with pytest.raises(PlanError, match="unsupported module: tt applies to Embedding, but 'blocks.0' is a Linear"):
        compress_(model, plan)
    assert isinstance(model.embed, nn.Embedding)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_compress_replaces_the_matched_modules_and_reports_them():
    model = Tiny()
    report = compress_(model, Plan((("re:.*embed", TTConfig(rank=4)),)))
    assert isinstance(model.embed, TTEmbedding) and isinstance(model.other_embed, TTEmbedding)
    entry = report.modules["embed"]
    assert entry["params_before"] == 120 * 16 and entry["params_after"] < entry["params_before"]


def test_clamped_rank_is_reported():
    with pytest.warns(UserWarning, match="clamped"):
        report = compress_(Tiny(), Plan((("other_embed", TTConfig(rank=10_000)),)))
    assert any("clamped" in note for note in report.notes)
