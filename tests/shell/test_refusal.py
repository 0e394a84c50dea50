"""A refusal of the shell reader reaches the user as the loader's one-line ConfigError."""

from __future__ import annotations

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.megatron_recipe import load_megatron_command_line
from ray_layout.shell.refusal import ShellError


def test_a_shell_refusal_is_a_config_error_of_one_line_at_the_loader() -> None:
    with pytest.raises(ConfigError) as caught:
        load_megatron_command_line(
            "if true; then\n  python pretrain_gpt.py --num-layers 2\n", "t.sh"
        )
    assert not isinstance(caught.value, ShellError)
    assert "\n" not in str(caught.value) and str(caught.value).startswith("t.sh:1:")
