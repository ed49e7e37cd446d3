"""The `compile_regions` lever (`trainers/levers/regions.py`), declared in its module alone:
LoopConfig, the API and `--fix` take it; beside a config with no whole-model compile, with
recomputation or a data-parallel wrapper it is refused in one line that names what to set; a
model in which nothing repeats refuses it in one line and is left as it was; a run marks each
repeated block as a nested compile region, trains the model the plain compile trains, keeps its
code for the next run, and gives the blocks their own class back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.lever_entry import accepted
from trainers import LEVERS, ConfigError, LoopConfig, RunArgs, Workload, load_workload, run
from trainers.blocks import find_blocks
from trainers.dynamo_state import counters
from trainers.gate import required_test
from trainers.kept_code import forget_compiled, keeping_compiled
from trainers.levers.regions import COMPILE_REGIONS
from trainers.workloads import SyntheticBatches
from trainers.workloads.mlp import classification_loss
from tuner.search.spaces.named import load_space
from tuner.search.spaces.space import config_key

REGIONS = {"compile": "default", "compile_regions": "blocks"}


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    assert LEVERS["compile_regions"] is COMPILE_REGIONS
    assert COMPILE_REGIONS.values() == ("none", "blocks") and COMPILE_REGIONS.default == "none"
    assert LoopConfig.from_dict(REGIONS).get("compile_regions") == "blocks"
    with pytest.raises(ConfigError, match="compile_regions='all' is invalid: allowed one of none"):
        LoopConfig.from_dict({"compile_regions": "all"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert required_test(LoopConfig.from_dict(REGIONS)) == "equivalence"
    # Not searched by the built-in spaces until a GPU has measured it.
    for name in ("full", "scale"):
        assert "compile_regions" not in load_space(name).params, name


@pytest.mark.parametrize(
    ("beside", "named"),
    [
        ({"compile": "none"}, "compile other than 'none' and compile_scope='model'"),
        ({"compile_scope": "blocks"}, "compile other than 'none' and compile_scope='model'"),
        ({"activation_checkpointing": "blocks"}, "activation_checkpointing='none'"),
    ],
)
def test_a_config_it_cannot_go_with_is_refused_in_one_line(
    beside: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        LoopConfig.from_dict({**REGIONS, **beside})
    message = str(caught.value)
    assert message.startswith("compile_regions='blocks' is invalid") and named in message
    assert "\n" not in message


def test_the_api_and_the_cli_take_the_same_values() -> None:
    for value, allowed in (("blocks", True), ("none", True), ("layers", False)):
        api, cli = accepted("compile_regions", value)
        assert api is cli is allowed, value


def test_a_model_in_which_nothing_repeats_refuses_it_and_is_left_as_it_was() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    kinds = [type(m) for m in workload.model.modules()]
    with pytest.raises(ConfigError) as caught:
        run(workload, LoopConfig.from_dict(REGIONS), RunArgs(steps=2, windows=1, device="cpu"))
    assert "no block repeats" in str(caught.value) and "\n" not in str(caught.value)
    assert [type(m) for m in workload.model.modules()] == kinds


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def _stack(seed: int) -> Workload:
    torch.manual_seed(seed)
    model = nn.Sequential(*(_Block() for _ in range(4)), nn.Linear(16, 3))
    batches = SyntheticBatches((torch.randn(2, 4, 16), torch.randint(0, 3, (2, 4))))
    return Workload(
        name="stack", preset="x", model=model, dataset=batches,
        loss_fn=classification_loss, samples_per_batch=4,
    )  # fmt: skip


@pytest.mark.slow
def test_a_run_trains_the_model_the_plain_compile_trains_and_keeps_its_code() -> None:
    forget_compiled()
    args = RunArgs(steps=3, warmup=2, windows=1, device="cpu")
    marked_config = LoopConfig.from_dict(REGIONS)
    plain = run(_stack(0), LoopConfig(compile="default"), args)
    traced = counters()["stats"]["calls_captured"]  # since the run's start
    forget_compiled()  # the marked run from a fresh Dynamo, as in a new process
    workload = _stack(0)
    with keeping_compiled(2):
        marked = run(workload, marked_config, args)
        # Each block's calls traced once, not once a block: fewer calls in the graph.
        assert 0 < counters()["stats"]["calls_captured"] < traced
        again = run(_stack(0), marked_config.replace(num_streams=2), args)
    assert marked.compile_s > 0 and not marked.compile_notes, marked.compile_notes
    assert marked.losses == pytest.approx(plain.losses, rel=1e-5)
    # The same marked class each run: Dynamo's type guards pass, and nothing compiles again.
    assert again.compile_s == 0.0 and again.compile_kept_s > 0, again.compile_notes
    assert again.losses == pytest.approx(marked.losses, rel=1e-5)
    assert [type(b) for b in find_blocks(workload.model)] == [_Block] * 4  # given back


def _float8_gpu() -> bool:
    from trainers.float8 import MIN_CAPABILITY

    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= MIN_CAPABILITY


@pytest.mark.gpu
@pytest.mark.skipif(not _float8_gpu(), reason="needs a CUDA GPU of compute capability >= 8.9")
@pytest.mark.parametrize("precision", ["bf16-autocast", "float8"])
def test_on_a_gpu_the_marked_model_trains_like_the_plain_compile(precision: str) -> None:
    """Float8's tensor subclasses and torch.nn's transformer layers inside the regions: the
    marked run traces fewer calls and trains the model the plain compile trains, within the
    rounding of other fusion."""
    pytest.importorskip("torchao.float8", reason="torchao is not installed")
    from trainers.workloads import disable_dropout

    def one(config: LoopConfig) -> tuple[list[float], int]:
        forget_compiled()
        workload = load_workload("transformer", "small", seed=0)
        disable_dropout(workload.model)
        args = RunArgs(steps=10, warmup=3, windows=1, device="cuda", precision=precision)  # type: ignore[arg-type]
        result = run(workload, config, args)
        assert result.compile_s > 0 and not result.compile_unstable, result.compile_notes
        return result.losses, counters()["stats"]["calls_captured"]

    plain, plain_calls = one(LoopConfig(compile="default"))
    marked, marked_calls = one(LoopConfig.from_dict(REGIONS))
    assert marked_calls < plain_calls
    assert marked == pytest.approx(plain, rel=2e-2)
