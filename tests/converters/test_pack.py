"""The fine-tune's pack: the folder holds what run.sh reads (the original in bf16, the plan, the texts,
the project's wheel), stays under its limit or is not written, and its commands run: the original
compressed by the plan there and fine-tuned."""

import json
import sys

import pytest
import torch

from compressor.errors import CompressorError
from converters.checkpoint import load_model, read_meta
from converters.pack import PACK_LIMIT, folder_bytes, pack_finetune
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def packed(tiny_bert_dir, tmp_path_factory):
    from converters.cli import main

    root = tmp_path_factory.mktemp("pack")
    assert main(["compress", str(tiny_bert_dir), "--rank", "4", "--fit", "aware", "--out", str(root / "ckpt")]) == 0
    size = pack_finetune(root / "ckpt", root / "pack", 60.0)
    return root, size


def test_the_pack_holds_what_run_sh_reads(tiny_bert_dir, packed):
    root, size = packed
    pack = root / "pack"
    names = {p.name for p in pack.iterdir()}
    assert names == {"original", "plan.json", "calib.txt", "finetune.txt", "prior.safetensors", "wheels", "run.sh"}
    assert [w.name.split("-")[0] for w in (pack / "wheels").iterdir()] == ["compressor"]
    assert size == folder_bytes(pack) <= PACK_LIMIT
    assert json.loads((pack / "plan.json").read_text()) == read_meta(root / "ckpt")["plan"]
    script = (pack / "run.sh").read_text()
    assert "compress original --plan plan.json --calib calib.txt --freq-prior prior.safetensors" in script
    assert "--time" in script
    original, _ = load_model(tiny_bert_dir)
    carried, _ = load_model(pack / "original")  # stored in bf16, loaded in float32
    assert next(carried.parameters()).dtype == torch.float32
    for (name, a), b in zip(original.state_dict().items(), carried.state_dict().values()):
        assert torch.allclose(a, b, rtol=2**-8, atol=1e-6), name  # bf16 keeps 8 bits of each weight


def test_run_sh_s_commands_compress_and_fine_tune_without_wordfreq(packed, capsys, monkeypatch):
    root, _ = packed
    pack, out = root / "pack", root / "there"
    for text in ("calib.txt", "finetune.txt"):  # their first passages: the whole texts' counts and windows take 10 s
        head = (pack / text).read_text(encoding="utf-8").splitlines()[:200]
        (root / text).write_text("\n".join(head) + "\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "wordfreq", None)  # the machine lacks it: the saved prior is read instead
    calib = ("--calib", root / "calib.txt", "--freq-prior", pack / "prior.safetensors")
    code, _, err = run_cli(capsys, "compress", pack / "original", "--plan", pack / "plan.json", *calib, "--out", out)
    assert code == 0 and "blended with the saved prior" in err, err
    code, _, err = run_cli(capsys, "finetune", out, "--data", root / "finetune.txt", "--steps", 2)
    assert code == 0 and "2 steps" in err, err


def test_a_pack_over_its_limit_is_not_written(packed):
    root, _ = packed
    with pytest.raises(CompressorError, match="MiB, above the 0 MiB"):
        pack_finetune(root / "ckpt", root / "small", 60.0, limit=1000)
    assert not (root / "small").exists()


def test_a_folder_that_is_not_a_pack_is_not_replaced(packed):
    root, _ = packed
    before = sorted(p.name for p in (root / "ckpt").iterdir())
    with pytest.raises(CompressorError, match="is there and is not a pack"):
        pack_finetune(root / "ckpt", root / "ckpt", 60.0)
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == before
