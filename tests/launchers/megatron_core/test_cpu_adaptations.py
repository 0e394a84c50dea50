"""megatron-core's CPU adaptations: a known version only, each named with its reason, applied in
a process of its own (never in the tuner's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launchers.megatron_core.cpu_adaptations import ADAPTATIONS, KNOWN_VERSIONS, check_version
from ray_layout.errors import ConfigError
from tests.helpers.paths import ROOT


def test_an_unknown_version_is_refused_in_one_line():
    with pytest.raises(ConfigError) as refused:
        check_version("0.17.0")
    assert "\n" not in str(refused.value) and "0.17.0" in str(refused.value)
    check_version(sorted(KNOWN_VERSIONS)[0])


def test_each_adaptation_has_a_unique_name_and_a_reason():
    names = [adaptation.name for adaptation in ADAPTATIONS]
    assert len(set(names)) == len(names) == 10
    assert all(len(adaptation.reason) > 40 for adaptation in ADAPTATIONS)


@pytest.mark.megatron
def run_in_child(program: str) -> str:
    """``program`` run by a fresh interpreter (the adaptations patch megatron-core for the whole
    process), which must succeed: its stdout, stripped."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_applied_in_a_child_process_they_make_the_cuda_calls_cpu_ones():
    program = (
        "from launchers.megatron_core.cpu_adaptations import apply_adaptations\n"
        "names = apply_adaptations()\n"
        "import torch\n"
        "from megatron.core.pipeline_parallel import schedules\n"
        "torch.cuda.synchronize()\n"
        "assert torch.zeros(1, device=torch.cuda.current_device()).device.type == 'cpu'\n"
        "assert schedules.torch.zeros([], device='cuda').device.type == 'cpu'\n"
        "assert torch.ones(1).cuda().device.type == 'cpu'\n"
        "print(','.join(names))\n"
    )
    output = run_in_child(program)
    assert output.split(",") == [adaptation.name for adaptation in ADAPTATIONS]


def test_a_missing_megatron_core_is_one_line(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_megatron(name, *args, **kwargs):
        if name.startswith("megatron"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_megatron)
    from launchers.megatron_core.cpu_adaptations import megatron_core_version

    with pytest.raises(ConfigError, match="needs megatron-core installed"):
        megatron_core_version()


@pytest.mark.megatron
def test_applied_in_a_child_process_recompute_reruns_a_forward_with_its_dropout_masks():
    """megatron-core's checkpoints on the CPU: ``tensor_parallel.checkpoint`` (full recompute,
    core_attn, mlp, moe) and ``CheckpointWithoutOutput`` (layernorm) give the gradients of the
    plain forward, dropout included, since the re-run draws the first forward's masks."""
    program = (
        "from launchers.megatron_core.cpu_adaptations import apply_adaptations\n"
        "apply_adaptations()\n"
        "import torch\n"
        "from megatron.core import tensor_parallel\n"
        "weight = torch.randn(8, 8, requires_grad=True)\n"
        "x = torch.randn(4, 8, requires_grad=True)\n"
        "def layer(h):\n"
        "    return torch.nn.functional.dropout(h @ weight, 0.5, training=True).tanh()\n"
        "def grads(run):\n"
        "    torch.manual_seed(7)\n"
        "    weight.grad = x.grad = None\n"
        "    out = run(x)\n"
        "    (out * out).sum().backward()\n"
        "    return out.detach(), weight.grad.clone(), x.grad.clone()\n"
        "plain = grads(layer)\n"
        "full = grads(lambda h: tensor_parallel.checkpoint(layer, False, h))\n"
        "def without_output(h):\n"
        "    saved = tensor_parallel.CheckpointWithoutOutput()\n"
        "    inner = saved.checkpoint(layer, h)\n"
        "    out = inner * 2\n"
        "    saved.discard_output_and_register_recompute(out)\n"
        "    return out / 2\n"
        "kept = grads(without_output)\n"
        "for other in (full, kept):\n"
        "    assert all(torch.allclose(a, b) for a, b in zip(plain, other)), other\n"
        "print('same')\n"
    )
    output = run_in_child(program)
    assert output == "same"
