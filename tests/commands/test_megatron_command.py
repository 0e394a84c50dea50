"""``megatron-command``: the ``pretrain_gpt.py`` line and environment of one rank, as a
profiling run would launch it, checked here with Megatron's own argument rules."""

from __future__ import annotations

import shlex

import pytest

from ray_layout.commands.main import main
from tests.helpers.commands_cli import HANDBOOK, SCRIPT, run_json
from tests.helpers.megatron_arguments_oracle import parse_megatron_args, validate_megatron_args

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def test_the_flags_choose_the_python_the_checkout_the_iterations_and_the_rendezvous(capsys):
    report = run_json(
        capsys,
        "megatron-command",
        HANDBOOK,
        "--rank",
        "5",
        "--gpus-per-node",
        "4",
        "--master-addr",
        "node0",
        "--master-port",
        "1234",
        "--python",
        "/usr/bin/python3",
        "--megatron-path",
        "/m",
        "--train-iters",
        "3",
    )
    argv, env = report["argv"], report["env"]
    assert argv[:2] == ["/usr/bin/python3", "/m/pretrain_gpt.py"]
    assert argv[argv.index("--train-iters") + 1] == "3"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == ("5", "8", "1")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node0", "1234")


@pytest.mark.parametrize(("config", "world"), [(HANDBOOK, 8), (SCRIPT, 16)])
def test_the_printed_command_line_is_one_megatron_accepts(capsys, config, world):
    report = run_json(capsys, "megatron-command", config)
    assert report["env"]["WORLD_SIZE"] == str(world)
    args = validate_megatron_args(parse_megatron_args(report["argv"][2:]), world_size=world)
    assert args.pipeline_model_parallel_size == 4 and args.train_iters == 10


def test_a_given_layout_replaces_the_configs_split_and_is_accepted(capsys):
    layout = "Et*5|t*6|t*5|mL"
    argv = run_json(capsys, "megatron-command", HANDBOOK, "--layout", layout)["argv"][2:]
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == layout
    validate_megatron_args(parse_megatron_args(argv), world_size=8)


def test_mock_data_unless_the_users_data_is_kept(capsys):
    mocked = run_json(capsys, "megatron-command", SCRIPT)["argv"]
    kept = run_json(capsys, "megatron-command", SCRIPT, "--keep-data")["argv"]
    assert "--mock-data" in mocked and "--data-path" not in mocked
    assert "--mock-data" not in kept
    assert kept[kept.index("--data-path") + 1] == "/data/corpus/fineweb_text_document"


def test_the_printed_line_is_the_json_as_a_shell_reads_it(capsys):
    report = run_json(capsys, "megatron-command", HANDBOOK, "--layout", "Et*5|t*6|t*5|mL")
    assert main(["megatron-command", HANDBOOK, "--layout", "Et*5|t*6|t*5|mL"]) == 0
    words = shlex.split(capsys.readouterr().out)
    assignments = [f"{name}={value}" for name, value in report["env"].items()]
    assert words == [*assignments, *report["argv"]]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rank", "8"], "rank 8 is outside the world of 8 ranks"),
        (["--layout", "Et*5|t*6|t*5|L"], "MTP layers"),
        (["--master-port", "0"], "--master-port must be >= 1, got 0"),
    ],
)
def test_what_no_run_could_launch_is_refused_in_one_line(capsys, flags, message):
    assert main(["megatron-command", HANDBOOK, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
