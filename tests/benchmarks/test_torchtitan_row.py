"""benchmarks/torchtitan_row.py's parts that need neither torchtitan nor a GPU: the parser of
torchtitan's step line (built here with torchtitan 0.3.0's own f-string and colours), the shape
-> flavor arguments, the tokenizer and documents it writes, the medians and wall-clock figures,
and the record it writes when torchtitan is not there. Where torchtitan is importable (not in
CI), its own tokenizer, dataloader and model build are run on what the script registers."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from benchmarks import torchtitan_row as row

HAS_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


class Color:  # torchtitan 0.3.0 tools/utils.py Color
    red, green, blue, cyan, magenta = "\033[31m", "\033[32m", "\033[34m", "\033[36m", "\033[35m"
    orange, turquoise, reset = "\033[38;2;180;60;0m", "\033[38;2;54;234;195m", "\033[39m"


class NoColor:
    red = green = blue = cyan = magenta = orange = turquoise = reset = ""


def step_line(color: Any, step: int, mfu: float | None, tps: float = 41234.4) -> str:
    """components/metrics.py MetricsProcessor.log's line, as torchtitan 0.3.0 writes it."""
    loss, grad_norm, gib, pct, tflops = 10.412345678, 3.14159, 35.1234, 25.0321, 312.456
    mfu_str = f"{mfu:.2f}%" if mfu is not None else "N/A"
    message = (
        f"{color.red}step: {step:2}  "
        f"{color.green}loss: {loss:8.5f}  "
        f"{color.orange}grad_norm: {grad_norm:7.4f}  "
        f"{color.turquoise}memory: {gib:5.2f}GiB"
        f"({pct:.2f}%)  "
        f"{color.blue}tps: {round(tps):,}  "
        f"{color.cyan}tflops: {tflops:,.2f}  "
        f"{color.magenta}mfu: {mfu_str}{color.reset}"
    )
    return f"[titan] 2026-11-29 10:00:00,123 - root - INFO - {message}"


@pytest.mark.parametrize("color", [Color(), NoColor()])
def test_the_step_line_is_parsed_with_or_without_colours(color: Any) -> None:
    parsed = row.parse_step_line(step_line(color, 7, mfu=41.27))
    assert parsed == {
        "step": 7,
        "loss": 10.41235,
        "grad_norm": 3.1416,
        "memory_gib": 35.12,
        "memory_pct": 25.03,
        "tps": 41234.0,
        "tflops": 312.46,
        "mfu_pct": 41.27,
    }


def test_float8_steps_log_no_mfu_and_large_figures_keep_their_digits() -> None:
    parsed = row.parse_step_line(step_line(NoColor(), 123, mfu=None, tps=1234567.8))
    assert parsed is not None
    assert parsed["step"] == 123 and parsed["mfu_pct"] is None and parsed["tps"] == 1234568.0


def test_other_lines_are_not_steps() -> None:
    validation = "validate step:  5  loss:  7.1234  memory: 35.12GiB(25.03%)  tps: 41,234"
    assert row.parse_step_line(validation) is None
    assert row.parse_step_line("[titan] ... - Training starts at step 1") is None
    assert row.parse_step_line("Peak FLOPS used for computing MFU: 9.890e+14") is None


@pytest.mark.parametrize(
    ("dim", "multiple_of", "multiplier", "hidden"),
    # torchtitan's own Llama3 flavors: 1B, 3B, 8B, 70B, 405B (models/llama3/__init__.py)
    [
        (2048, 1024, 1.5, 8192),
        (3072, 1024, 1.0, 8192),
        (4096, 1024, 1.3, 14336),
        (8192, 4096, 1.3, 28672),
        (16384, 4096, 1.2, 53248),
        (256, 256, None, 768),  # its debugmodel
    ],
)
def test_the_ffn_formula_gives_torchtitans_flavors(
    dim: int, multiple_of: int, multiplier: float | None, hidden: int
) -> None:
    assert row.ffn_hidden_dim(dim, multiple_of, multiplier) == hidden


def test_the_shape_maps_to_torchtitan_ffn_arguments() -> None:
    tinyllama = row.ffn_args(2048, 5632)
    assert tinyllama["exact"] and tinyllama["hidden_dim"] == 5632
    assert (tinyllama["multiple_of"], tinyllama["ffn_dim_multiplier"]) == (256, None)
    four_x = row.ffn_args(2048, 8192)
    assert four_x["exact"] and four_x["hidden_dim"] == 8192
    near = row.ffn_args(2048, 6000)
    assert not near["exact"] and near["requested"] == 6000
    assert abs(near["hidden_dim"] - 6000) <= min(abs(5632 - 6000), abs(6144 - 6000))


def test_the_written_tokenizer_has_the_whole_vocabulary(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    shape = row.Shape(vocab=1000, seq=64)
    info = row.write_assets(tmp_path, shape, docs=5, seed=3)
    assert info["words_per_doc"] == 96 and info["docs"] == 5
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size() == 1000
    assert [tok.token_to_id(t) for t in ("<unk>", "<s>", "</s>", "t999")] == [0, 1, 2, 999]
    assert tok.encode("t3 t998 nope").ids == [3, 998, 0]
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<s>" and config["eos_token"] == "</s>"
    lines = (tmp_path / "data.jsonl").read_text().splitlines()
    ids = [tok.encode(json.loads(line)["text"]).ids for line in lines]
    assert len(ids) == 5 and all(len(doc) == 96 for doc in ids)
    assert all(3 <= i < 1000 for doc in ids for i in doc)


def test_the_documents_are_seeded(tmp_path: Path) -> None:
    shape = row.Shape(vocab=500, seq=32)
    row.write_assets(tmp_path / "a", shape, docs=3, seed=1)
    row.write_assets(tmp_path / "b", shape, docs=3, seed=1)
    row.write_assets(tmp_path / "c", shape, docs=3, seed=2)
    text = {name: (tmp_path / name / "data.jsonl").read_text() for name in "abc"}
    assert text["a"] == text["b"] != text["c"]


def test_medians_leave_out_the_warmup_and_wall_time_spans_the_rest() -> None:
    steps = [{"step": i, "tps": 10.0 * i, "tflops": 1.0, "mfu_pct": None} for i in range(1, 7)]
    spans = [(0.0, 5.0), (5.0, 6.0), (6.0, 7.0), (7.5, 8.0), (8.0, 9.0), (9.0, 10.5)]
    summary = row.summarize(steps, spans, warmup=2, tokens=100)
    assert summary["steps_after_warmup"] == 4
    assert summary["median"]["tps"] == 45.0 and summary["median"]["mfu_pct"] is None
    # from the end of step 2 (6.0) to the end of step 6 (10.5): 4 steps of 100 tokens
    assert summary["wall"]["window_s"] == 4.5 and summary["wall"]["steps"] == 4
    assert summary["wall"]["tokens_per_s"] == pytest.approx(400 / 4.5)
    assert summary["wall"]["median_host_step_s"] == 1.0  # of 1.0, 0.5, 1.0, 1.5


def test_the_torchrun_variables_keep_what_is_set() -> None:
    with mock.patch.dict(os.environ, clear=True):  # the process's own environment put back after
        os.environ["MASTER_PORT"] = "12345"
        env = row.torchrun_env()
        assert env["WORLD_SIZE"] == os.environ["WORLD_SIZE"] == "1"
    assert env["RANK"] == env["LOCAL_RANK"] == "0" and env["MASTER_PORT"] == "12345"
    assert env["MASTER_ADDR"] == "127.0.0.1"


def test_the_torch_shim_fills_only_a_missing_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed.fsdp as fsdp

    with mock.patch.dict(sys.modules):
        assert "torch.distributed.fsdp.DataParallelMeshDims" not in row.install_stubs(True)
        # torch 2.11's namespace: the name torchtitan 0.3.0 imports is not there
        monkeypatch.delattr(fsdp, "DataParallelMeshDims", raising=False)
        assert "torch.distributed.fsdp.DataParallelMeshDims" not in row.install_stubs(False)
        assert not hasattr(fsdp, "DataParallelMeshDims")
        stubs = row.install_stubs(True)
    assert stubs["torch.distributed.fsdp.DataParallelMeshDims"].startswith("absent in 2.")
    # as torchtitan's full_dtensor.py builds it
    dims = fsdp.DataParallelMeshDims(shard="dp_shard", replicate=None)  # type: ignore[attr-defined]
    assert (dims.shard, dims.replicate) == ("dp_shard", None)


@pytest.mark.skipif(HAS_TORCHTITAN, reason="torchtitan is importable here")
def test_without_torchtitan_the_record_says_so(tmp_path: Path) -> None:
    flags = ["--steps", "2", "--warmup", "1", "--seq", "64", "--vocab", "200", "--docs", "2"]
    # its torchrun variables and stub modules are taken back after, for the other tests
    with mock.patch.dict(os.environ), mock.patch.dict(sys.modules):
        code = row.main([*flags, "--out", str(tmp_path), "--data-dir", str(tmp_path / "data")])
    record = json.loads((tmp_path / "torchtitan-row.json").read_text())
    assert code == 1 and record["ok"] is False
    assert record["error"]["phase"] == "import" and record["error"]["step"] is None
    assert record["error"]["type"] == "ModuleNotFoundError"
    assert "No module named 'torchtitan'" in record["error"]["message"]
    assert record["shape"]["seq"] == 64 and record["steps"] == []
    assert (tmp_path / "data" / "tokenizer.json").exists()


@pytest.mark.skipif(not HAS_TORCHTITAN, reason="torchtitan is not installed")
def test_torchtitan_reads_the_registered_data_and_builds_the_flavor(tmp_path: Path) -> None:
    shape = row.Shape(seq=128, batch=2)
    row.write_assets(tmp_path, shape, docs=4)
    with mock.patch.dict(sys.modules):  # the stubs, if any, taken back after
        row.install_stubs()
        check_torchtitan(shape, tmp_path)


def check_torchtitan(shape: row.Shape, tmp_path: Path) -> None:
    import torch

    assert row.register(shape, str(tmp_path))["hidden_dim"] == shape.ffn
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.models.llama3 import model_registry

    tok = HuggingFaceTokenizer(tokenizer_path=str(tmp_path))
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    args = row.parser().parse_args(["--no-float8", "--no-compile", "--out", str(tmp_path)])
    config = row.trainer_config(args, shape, tmp_path)
    loader = config.dataloader.build(
        dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=2
    )
    inputs, labels = next(iter(loader))
    assert inputs["input"].shape == labels.shape == (2, 128)
    assert inputs["input"][0, 0] == 1 and int(inputs["input"].max()) < shape.vocab
    spec = model_registry(row.FLAVOR)
    with torch.device("meta"):
        model = spec.model.build()
    params, _ = spec.model.get_nparams_and_flops(model, shape.seq)
    layer = 4 * 2048 * 2048 - 2 * 2048 * (2048 - 512) + 3 * 2048 * 5632 + 2 * 2048
    assert params == 16 * layer + 2 * 32000 * 2048 + 2048


def test_the_torch_shim_lets_the_block_mask_take_the_keyword_torch_2_11_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.nn.attention.flex_attention as flex

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def older(mask_mod: Any, B: Any, H: Any, Q_LEN: int, KV_LEN: int, **kwargs: Any) -> str:
        calls.append(((mask_mod, B, H, Q_LEN, KV_LEN), kwargs))
        return "mask"

    with mock.patch.dict(sys.modules):
        assert not any("create_block_mask" in name for name in row.install_stubs(True))
        monkeypatch.setattr(flex, "create_block_mask", older)  # torch 2.11's signature
        assert not any("create_block_mask" in name for name in row.install_stubs(False))
        assert flex.create_block_mask is older
        stubs = row.install_stubs(True)
    assert any("separate_full_blocks" in name for name in stubs)
    shimmed = flex.create_block_mask
    assert shimmed(None, 2, None, 8, 8, device="cpu", separate_full_blocks=True) == "mask"
    assert calls == [((None, 2, None, 8, 8), {"device": "cpu"})]
    with pytest.raises(NotImplementedError, match="separate_full_blocks=False"):
        shimmed(None, 2, None, 8, 8, separate_full_blocks=False)
