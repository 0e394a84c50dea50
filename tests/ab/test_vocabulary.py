"""The A/B test's words as types: a role and its baseline, how an arm ended, what a look decided,
and the stop reasons a resume reads back by their code, never by their prose."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ray_layout.ab.vocabulary import ABAction, ArmRole, ArmStatus, StopReason, role_label
from ray_layout.model.baselines import BaselineName
from tests.helpers.ab_stored_errors import OLD_COVERED, OLD_SETTLED


def test_a_baselines_role_holds_its_name_and_gives_it_back():
    """The store and the report hold one name for a baseline and the arm that runs it."""
    for baseline in BaselineName:
        role = ArmRole.of(baseline)
        assert role == baseline.value and role.baseline is baseline
    assert ArmRole.CANDIDATE.baseline is None
    assert {role.baseline for role in ArmRole} == {None, *BaselineName}


def test_several_roles_show_as_one_label_in_the_order_given():
    roles = (ArmRole.CANDIDATE, ArmRole.COUNT_BASED)
    assert role_label(roles) == "candidate + count-based rule"
    assert role_label(reversed(roles)) == "count-based rule + candidate"
    assert role_label([ArmRole.DEFAULT]) == "Megatron default" and role_label([]) == ""


def test_only_a_stop_or_a_failure_ends_an_arm_early():
    early = {status for status in ArmStatus if status.ended_early}
    assert early == {ArmStatus.STOPPED, ArmStatus.FAILED}


@pytest.mark.parametrize(
    ("action", "terminal", "status"),
    [
        (ABAction.CONTINUE, False, ArmStatus.FINISHED),
        (ABAction.STOP, True, ArmStatus.STOPPED),
        (ABAction.WIN, True, ArmStatus.WON),
        (ABAction.LOSE, True, ArmStatus.LOST),
    ],
)
def test_each_action_says_whether_it_ends_the_arm_and_how(action, terminal, status):
    assert action.is_terminal is terminal and action.status is status


def test_a_stop_reason_is_read_from_the_code_heading_a_stored_error():
    assert StopReason.of(OLD_SETTLED) is StopReason.SETTLED
    assert StopReason.of(OLD_COVERED) is StopReason.COVERED
    assert StopReason.of(None) is None and StopReason.of("") is None


def test_a_stop_reasons_text_leads_with_its_code_and_reads_back():
    for reason in StopReason:
        assert reason.text.startswith(f"{reason.value}: ") and "\n" not in reason.text
        assert StopReason.of(reason.text) is reason and StopReason.of(reason.value) is reason


@given(st.sampled_from(list(StopReason)), st.text(), st.sampled_from(["", " ", "  "]))
def test_any_prose_after_a_code_reads_as_that_reason(reason, prose, pad):
    assert StopReason.of(f"{pad}{reason.value}{pad}:{prose}") is reason


CODES = {reason.value for reason in StopReason}


@given(st.text().filter(lambda error: error.partition(":")[0].strip() not in CODES))
def test_an_error_not_headed_by_a_code_is_a_real_stop(error):
    """Such as "unsettled: x" or "tied and settled": the arm lost."""
    assert StopReason.of(error) is None
