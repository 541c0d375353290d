"""The measured matmul layout (portable_spec/core/matmul_layout.py): the choice follows the measured costs (fake
timers, no timing asserted), is cached per machine and reused, computes what nn.Linear computes, and leaves every
layer as it found it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.matmul_layout import (
    MAX_ROWS,
    LayoutTable,
    MeasuredLinear,
    machine_key,
    measured_linears,
    time_layouts,
)
from portable_spec.core.testing import tiny_drafter, tiny_target

CPU = torch.device("cpu")


def timer_preferring(preferred_rows: set[int]):
    """A fake timer: 'transposed' is faster exactly for these row counts; it records what it was asked."""
    asked = []

    def timer(out_features, in_features, rows, dtype, device):
        asked.append((out_features, in_features, rows))
        fast, slow = 1e-4, 3e-4
        return {"linear": slow, "transposed": fast} if rows in preferred_rows else {"linear": fast, "transposed": slow}

    timer.asked = asked
    return timer


def test_choice_follows_the_measured_costs_per_row_count(tmp_path):
    timer = timer_preferring({2, 3})
    table = LayoutTable.load(CPU, tmp_path / "layouts.json", timer=timer)
    assert [table.layout(80, 48, rows, torch.float32, CPU) for rows in (2, 3, 4)] == [
        "transposed",
        "transposed",
        "linear",
    ]
    assert timer.asked == [(80, 48, 2), (80, 48, 3), (80, 48, 4)]
    table.layout(80, 48, 2, torch.float32, CPU)  # known: not measured again
    assert len(timer.asked) == 3
    for untimed in (1, MAX_ROWS + 1):  # one row (a GEMV either way) and prefill-sized products: torch's own
        assert table.layout(80, 48, untimed, torch.float32, CPU) == "linear" and len(timer.asked) == 3
    assert "transposed for 2 products (rows 2-3)" in table.summary()


def test_torch_layout_stays_unless_the_other_wins_by_the_margin(tmp_path):
    close = LayoutTable("test", timer=lambda *shape: {"linear": 1.0, "transposed": 0.97})
    clear = LayoutTable("test", timer=lambda *shape: {"linear": 1.0, "transposed": 0.9})
    assert close.layout(8, 8, 2, torch.float32, CPU) == "linear"
    assert clear.layout(8, 8, 2, torch.float32, CPU) == "transposed"


def test_choices_are_cached_per_machine_and_reused(tmp_path):
    path = tmp_path / "layouts.json"
    path.write_text(json.dumps({"another machine": {"80x48x2x float32": "linear"}}))
    first = LayoutTable.load(CPU, path, timer=timer_preferring({2}))
    assert first.layout(80, 48, 2, torch.float32, CPU) == "transposed"
    saved = json.loads(path.read_text())
    assert saved["another machine"] == {"80x48x2x float32": "linear"}  # nothing of another machine's is lost
    assert saved[machine_key(CPU)] == {"80x48x2xfloat32": "transposed"}
    never = timer_preferring(set())  # would choose "linear" if asked
    second = LayoutTable.load(CPU, path, timer=never)
    assert second.layout(80, 48, 2, torch.float32, CPU) == "transposed" and never.asked == []


def test_an_unreadable_cache_is_measured_again_not_fatal(tmp_path):
    path = tmp_path / "layouts.json"
    path.write_text("{ not json")
    table = LayoutTable.load(CPU, path, timer=timer_preferring({2}))
    assert table.layout(80, 48, 2, torch.float32, CPU) == "transposed"
    assert json.loads(path.read_text())[machine_key(CPU)]


def test_the_real_timer_times_both_layouts():
    seconds = time_layouts(64, 32, 3, torch.float32, CPU)
    assert set(seconds) == {"linear", "transposed"} and all(s > 0 for s in seconds.values())


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 9, 33])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", ["linear", "transposed"])
def test_same_values_as_nn_linear(rows, bias, layout):
    torch.manual_seed(rows)
    layer = nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, rows, 48)
    expected = layer(x)
    table = LayoutTable.fixed(layout, range(1, MAX_ROWS + 1))
    with torch.no_grad(), measured_linears(table, layer):
        assert type(layer) is MeasuredLinear
        got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if layout == "linear":  # torch's own layer, exactly
        assert torch.equal(got, expected)


def test_layers_are_restored_even_after_an_error():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with (
        pytest.raises(RuntimeError, match="boom"),
        measured_linears(LayoutTable.fixed("transposed", range(2, 9)), model),
    ):
        assert all(type(m) is MeasuredLinear for m in model if isinstance(m, nn.Linear))
        raise RuntimeError("boom")
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
    assert not any(hasattr(m, "_layouts") for m in model)


def test_training_keeps_torch_layout():
    """With autograd on (training), the layer is torch's own and nothing is measured."""
    layer = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    timer = timer_preferring({4})
    with measured_linears(LayoutTable("test", timer=timer), layer):
        assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    assert timer.asked == []


@pytest.mark.parametrize("kind", ["parallel", "depth_causal", "autoregressive"])
def test_greedy_output_same_whatever_layout_is_chosen(kind):
    target = tiny_target()
    drafter = tiny_drafter(target, kind)
    config = GenerationConfig(max_new_tokens=12, num_draft_tokens=3)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    plain = SpeculativeDecoder(target, matmul_layout=None).generate(prompts, config).tokens
    tables = [None, LayoutTable.fixed("transposed", range(2, 9)), LayoutTable("test", timer=timer_preferring({2, 5}))]
    for table in tables:
        assert SpeculativeDecoder(target, drafter, matmul_layout=table).generate(prompts, config).tokens == plain
    assert all(type(m) is not MeasuredLinear for m in list(target.model.modules()) + list(drafter.modules()))
