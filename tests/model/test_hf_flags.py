"""The Megatron flags that train a Hugging Face model as released (router, rotary, norm epsilon):
each family's, every one a flag of Megatron's table set once, the user's winning; and a key
Megatron cannot follow is one line naming it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ray_layout.errors import ConfigError
from ray_layout.model.hf_config import load_hf_config
from ray_layout.model.hf_flags import (
    DEEPSEEK_V3,
    GLM4_MOE,
    MIXTRAL,
    UNNORMALIZED_SOFTMAX,
    Defaults,
    rotary_notes,
    training_flags,
    with_user_flags,
)
from ray_layout.model.megatron_args import check_arguments, megatron_flag_table, parse_flags
from tests.helpers.model_hf_configs import GLM45, GLM45_AIR, HF, KIMI_K2, SMALL, config, real


def test_deepseek_v3_flags():
    assert load_hf_config(HF / "DeepSeek-V3" / "config.json").megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",  # topk_method noaux_tc: e_score_correction_bias
        "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "10000",
        "--rope-type", "yarn", "--rotary-scaling-factor", "40.0",
        "--mscale", "1.0", "--mscale-all-dim", "1.0",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_kimi_k2_flags_of_this_file():
    """This copy has no router or rope keys: DeepseekV3Config's defaults (8 groups of which 4,
    scaling 2.5, rope_theta 10000, no YaRN); MLA without YaRN needs plain rope, unfused."""
    assert load_hf_config(real(KIMI_K2)).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "10000",
        "--rope-type", "rope", "--no-rope-fusion",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


# The router and rope keys of moonshotai/Kimi-K2-Instruct's released config.json.
KIMI_K2_ROUTER_AND_ROPE = {
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rms_norm_eps": 1e-06,
}


def test_kimi_k2_flags_as_released():
    """One group: no group-limited routing.  YaRN's beta_fast 1 has no Megatron flag (MLA fixes
    32), so it is not carried."""
    raw = real(KIMI_K2) | KIMI_K2_ROUTER_AND_ROPE
    assert load_hf_config(raw).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", "2.827",
        "--moe-grouped-gemm",
        "--rotary-base", "50000",
        "--rope-type", "yarn", "--rotary-scaling-factor", "32.0",
        "--mscale", "1.0", "--mscale-all-dim", "1.0",
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_glm45_air_flags():
    """GLM routes as DeepSeek-V3 does (sigmoid, e_score_correction_bias), here in one group."""
    assert load_hf_config(real(GLM45_AIR)).megatron_args == (
        "--moe-router-score-function", "sigmoid",
        "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", "2.5",
        "--moe-grouped-gemm",
        "--rotary-base", "1000000",
        "--rotary-percent", "0.5",  # partial_rotary_factor
        "--norm-epsilon", "1e-06",
    )  # fmt: skip


def test_softmax_families_flags():
    """Qwen3-MoE renormalizes its top-k softmax weights (norm_topk_prob), which is Megatron's
    softmax over the top-k logits; OLMoE does not: --moe-router-pre-softmax."""
    assert load_hf_config(HF / "Qwen3-30B-A3B" / "config.json").megatron_args == (
        "--moe-router-score-function", "softmax", "--moe-grouped-gemm",
        "--rotary-base", "1000000", "--norm-epsilon", "1e-06",
    )  # fmt: skip
    olmoe = load_hf_config(HF / "OLMoE-1B-7B-0924" / "config.json").megatron_args
    assert olmoe[:3] == ("--moe-router-score-function", "softmax", "--moe-router-pre-softmax")
    mixtral = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").megatron_args
    assert "--moe-router-pre-softmax" not in mixtral
    top1 = load_hf_config(config("Mixtral-8x7B-v0.1") | {"num_experts_per_tok": 1})
    assert "--moe-router-pre-softmax" in top1.megatron_args  # Megatron refuses top-1 without


def test_dense_llama3_rope_scaling_and_transformers5_rope_parameters():
    raw = {
        "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "vocab_size": 1024,
        "max_position_embeddings": 4096, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }  # fmt: skip
    assert load_hf_config(raw).megatron_args == (
        "--rotary-base", "500000", "--use-rope-scaling", "--rope-scaling-factor", "32.0",
        "--norm-epsilon", "1e-05",
    )  # fmt: skip
    glm = GLM45 | {"rope_parameters": {"rope_theta": 20000.0, "partial_rotary_factor": 0.25}}
    del glm["rope_theta"], glm["partial_rotary_factor"]
    flags = load_hf_config(glm).megatron_args
    assert flags[flags.index("--rotary-base") + 1] == "20000"
    assert flags[flags.index("--rotary-percent") + 1] == "0.25"


def _rope(scaling: dict, model=None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the rotary flags, the rotary notes) of a dense Llama-shaped file with ``scaling``."""
    raw = DENSE_LLAMA | {"rope_scaling": scaling}
    flags = training_flags(raw, model or DENSE_MODEL, Defaults(), "f")
    rotary = flags[flags.index("--rotary-base") : flags.index("--norm-epsilon")]
    return rotary, rotary_notes(raw, model or DENSE_MODEL)


def test_llama3_scaling_names_what_megatron_fixes_otherwise():
    """Megatron's llama3 scaling fixes low/high frequency factors 1 and 4 over 8192 tokens
    (Llama 3.1's); Scout's high factor 1 and 4096 tokens have no flag: the note says so."""
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    assert _rope(llama31) == (
        ("--rotary-base", "10000", "--use-rope-scaling", "--rope-scaling-factor", "8.0"),
        (),
    )
    assert _rope({"rope_type": "llama3", "factor": 8.0})[1] == ()
    scout = llama31 | {"high_freq_factor": 1.0, "original_max_position_embeddings": 4096}
    assert _rope(scout)[1] == (
        "its llama3 RoPE scaling's high_freq_factor 1 (Megatron's is 4), "
        "original_max_position_embeddings 4096 (Megatron's is 8192) has no Megatron flag: it "
        "trains with Megatron's",
    )
    with pytest.raises(ConfigError, match="f: rope_scaling low_freq_factor must be > 0"):
        _rope(llama31 | {"low_freq_factor": 0})


def test_every_rope_scaling_megatron_trains_is_a_flag_and_the_rest_a_note():
    """linear by a whole factor divides positions as --rotary-seq-len-interpolation-factor does;
    dynamic NTK is plain RoPE up to max_position_embeddings; YaRN outside MLA, longrope and a
    fractional linear factor have no flag: a note says so, never silence."""
    plain = ("--rotary-base", "10000")
    assert _rope({"rope_type": "linear", "factor": 4.0}) == (
        (*plain, "--rotary-seq-len-interpolation-factor", "4"),
        (),
    )
    assert _rope({"type": "linear", "factor": 2.5}) == (
        plain,
        ("its linear RoPE scaling has no Megatron core_v0.16.1 flag "
         "(--rotary-seq-len-interpolation-factor takes an integer, not 2.5): the runs train "
         "plain RoPE",),
    )  # fmt: skip
    flags, notes = _rope({"rope_type": "dynamic", "factor": 2.0})
    assert flags == plain and "acts only past max_position_embeddings (4096 tokens)" in notes[0]
    for kind, why in (("yarn", " outside MLA"), ("longrope", "")):
        scaling = {"rope_type": kind, "factor": 4.0, "short_factor": [1.0], "long_factor": [2.0]}
        assert _rope(scaling) == (
            plain,
            (f"its {kind} RoPE scaling has no Megatron core_v0.16.1 flag{why}: the runs train "
             "plain RoPE",),
        )  # fmt: skip
    with pytest.raises(ConfigError, match=r"^f: rope_scaling rope_type 'ntk' is not one of"):
        _rope({"rope_type": "ntk", "factor": 2.0})
    with pytest.raises(ConfigError, match="rope_scaling factor must be at most 1e"):
        _rope({"rope_type": "linear", "factor": 10**400})


def test_mla_takes_only_yarn_and_names_the_yarn_keys_megatron_fixes():
    """MLA builds YaRN or plain RoPE; Kimi-K2's beta_fast 1 is not Megatron's fixed 32."""
    deepseek = load_hf_config(config("DeepSeek-V3"))
    assert deepseek.notes == ()
    raw = config("DeepSeek-V3")
    kimi = raw | {"rope_scaling": raw["rope_scaling"] | {"beta_fast": 1.0}}
    assert load_hf_config(kimi).notes == (
        "deepseek_v3: its yarn RoPE scaling's beta_fast 1 (Megatron's is 32) has no Megatron "
        "flag: it trains with Megatron's",
    )
    linear = load_hf_config(raw | {"rope_scaling": {"type": "linear", "factor": 4}})
    assert "--rope-type" in linear.megatron_args and "rope" in linear.megatron_args
    assert "--rotary-seq-len-interpolation-factor" not in linear.megatron_args
    assert linear.notes == (
        "deepseek_v3: its linear RoPE scaling has no Megatron core_v0.16.1 flag for MLA: the runs "
        "train plain RoPE",
    )


def test_every_derived_flag_is_megatrons():
    raws = {name: config(name) for name in ("DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1",
                                            "OLMoE-1B-7B-0924")}  # fmt: skip
    raws |= {"GLM-4.5": GLM45, **SMALL}
    for path in (KIMI_K2, GLM45_AIR):
        if path.is_file():
            raws[path.parent.name] = json.loads(path.read_text())
            raws[path.parent.name + " as released"] = raws[path.parent.name] | (
                KIMI_K2_ROUTER_AND_ROPE if path == KIMI_K2 else {}
            )
    for name, raw in raws.items():
        flags = load_hf_config(raw).megatron_args
        assert flags, name
        check_arguments(flags, name)
        dests = [megatron_flag_table()[word]["dest"] for word in flags if word.startswith("--")]
        assert len(dests) == len(set(dests)), name


def test_derived_flags_come_first_and_the_users_win():
    raw = config("DeepSeek-V3") | {
        "megatron_args": ["--rotary-base", "20000", "--moe-grouped-gemm", "--norm-epsilon=1e-5",
                          "--overlap-grad-reduce"],
    }  # fmt: skip
    flags = load_hf_config(raw).megatron_args
    assert flags[-5:] == tuple(raw["megatron_args"])
    assert flags.count("--rotary-base") == flags.count("--moe-grouped-gemm") == 1
    assert "--norm-epsilon" not in flags  # only the user's --norm-epsilon=1e-5
    assert flags[:2] == ("--moe-router-score-function", "sigmoid")
    check_arguments(flags, "test")
    table = megatron_flag_table()
    dests = [table[w.partition("=")[0]]["dest"] for w in flags if w.startswith("--")]
    assert len(dests) == len(set(dests))
    assert parse_flags(flags, "test")["rotary_base"] == 20000


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rope_theta": 10000.5}, "rope_theta 10000.5 is not a whole number"),
        ({"rope_theta": "1e4"}, "rope_theta must be a finite number, got '1e4'"),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be > 0, got -1"),
        ({"scoring_func": "relu"}, "scoring_func must be softmax or sigmoid, got 'relu'"),
        ({"topk_method": "best"}, "topk_method must be one of greedy, group_limited_greedy,"),
        ({"scoring_func": "softmax"}, "topk_method noaux_tc needs scoring_func sigmoid"),
        ({"n_group": 7}, "n_group 7 does not divide the 256 experts"),
        ({"n_group": "8"}, "n_group must be an integer, got '8'"),
        ({"topk_group": 16}, "topk_group 16 is more than n_group 8"),
        ({"num_experts_per_tok": 2}, "num_experts_per_tok 2 is less than topk_group 4"),
        ({"norm_topk_prob": "yes"}, "norm_topk_prob must be true or false"),
        ({"routed_scaling_factor": 0}, "routed_scaling_factor must be > 0, got 0"),
        ({"rope_scaling": "yarn"}, "rope_scaling must be a mapping, got 'yarn'"),
        ({"rope_scaling": {"type": "yarn"}}, "rope_scaling has no factor"),
        ({"rope_scaling": {"type": "yarn", "factor": 40, "mscale_all_dim": -1}},
         "rope_scaling mscale_all_dim must be at least 0, got -1"),
        ({"megatron_args": "--bf16"}, "megatron_args must be a list of flags and values"),
    ],
)  # fmt: skip
def test_training_flag_errors_name_the_key(change, message):
    with pytest.raises(ConfigError) as info:
        load_hf_config(config("DeepSeek-V3") | change, source="ds.json")
    assert str(info.value).startswith("ds.json: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


MIXTRAL_MODEL = load_hf_config(HF / "Mixtral-8x7B-v0.1" / "config.json").model
DENSE_LLAMA = {
    "model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 4, "vocab_size": 1024, "max_position_embeddings": 4096,
}  # fmt: skip
DENSE_MODEL = load_hf_config(DENSE_LLAMA).model
DENSE_LEARNED = replace(
    MIXTRAL_MODEL,
    num_experts=0,
    moe_layer_pattern=(False,) * MIXTRAL_MODEL.num_layers,
    position_embedding_type="learned_absolute",
)


def test_where_the_file_is_silent_the_familys_defaults_decide():
    assert training_flags({}, MIXTRAL_MODEL, Defaults(), "m") == (
        *("--moe-router-score-function", "softmax", "--moe-grouped-gemm"),
        *("--rotary-base", "10000", "--norm-epsilon", "1e-06"),
    )
    mixtral = training_flags({}, MIXTRAL_MODEL, MIXTRAL, "m")
    assert mixtral[-4:] == ("--rotary-base", "1000000", "--norm-epsilon", "1e-05")
    assert "--moe-router-pre-softmax" in training_flags(
        {}, MIXTRAL_MODEL, UNNORMALIZED_SOFTMAX, "m"
    )
    assert training_flags({}, DENSE_LEARNED, Defaults(), "m") == ("--norm-epsilon", "1e-06")


def test_what_a_familys_modeling_code_hard_wires_wins_over_the_file():
    raw = {"scoring_func": "softmax", "topk_method": "greedy", "n_group": 1}
    flags = training_flags(raw, MIXTRAL_MODEL, GLM4_MOE, "glm")
    assert flags[:3] == (
        "--moe-router-score-function",
        "sigmoid",
        "--moe-router-enable-expert-bias",
    )
    assert flags[flags.index("--rotary-percent") + 1] == "0.5"  # GLM's partial rotary default
    deepseek = training_flags({"topk_group": 2}, MIXTRAL_MODEL, DEEPSEEK_V3, "ds")
    assert deepseek[deepseek.index("--moe-router-num-groups") + 1] == "8"  # DeepSeek's 8 groups


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"rms_norm_eps": float("inf")}, "m: rms_norm_eps must be a finite number, got inf"),
        ({"rms_norm_eps": True}, "m: rms_norm_eps must be a finite number, got True"),
        ({"rope_theta": float("nan")}, "m: rope_theta must be a finite number, got nan"),
        (
            {"routed_scaling_factor": "2"},
            "m: routed_scaling_factor must be a finite number, got '2'",
        ),
    ],
)
def test_a_value_megatron_cannot_take_is_one_line_naming_the_key(raw, message):
    with pytest.raises(ConfigError) as info:
        training_flags(raw, MIXTRAL_MODEL, Defaults(), "m")
    assert str(info.value) == message


def test_floats_are_written_as_argparse_reads_them_back():
    raw = {"rms_norm_eps": 1e-5, "routed_scaling_factor": 2}
    flags = training_flags(raw, MIXTRAL_MODEL, Defaults(), "m")
    parsed = parse_flags(flags, "m")
    assert (parsed["layernorm_epsilon"], parsed["moe_router_topk_scaling_factor"]) == (1e-5, 2.0)


def test_the_users_setting_replaces_the_derived_one_under_any_of_its_names():
    derived = ("--rotary-base", "10000", "--no-fp8-wgrad", "--norm-epsilon", "1e-06")
    user = ("--rotary-base=5", "--disable-fp8-wgrad", "--my-own-flag", "x")
    assert with_user_flags(derived, user) == ("--norm-epsilon", "1e-06", *user)
    assert with_user_flags(derived, ()) == derived
