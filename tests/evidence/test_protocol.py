"""The worker protocol's own rules: option declarations and the shapes both sides share."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coldbench.evidence.contract.protocol import (
    API_PREFIX,
    LEASE_WAIT_MAX_S,
    CompleteRequest,
    LeaseRequest,
    OptionDeclaration,
    RegisterRequest,
    RepositoryOffer,
)


def test_int_option_bounds_are_inclusive() -> None:
    option = OptionDeclaration(type="int", min=1, max=8192)
    assert option.why_not(1) is None and option.why_not(8192) is None
    assert option.why_not(0) == "0 is below the minimum 1"
    assert option.why_not(8193) == "8193 is above the maximum 8192"
    assert option.why_not(True) == "True is not a whole number"
    assert option.why_not("4096") == "'4096' is not a whole number"
    assert option.describe() == "int 1..8192"
    assert OptionDeclaration(type="int", min=1).describe() == "int >= 1"
    assert OptionDeclaration(type="int").why_not(-5) is None


def test_bool_option_takes_true_false_one_and_zero() -> None:
    option = OptionDeclaration(type="bool")
    for value in (True, False, 1, 0):
        assert option.why_not(value) is None
    assert option.why_not(2) == "2 is not true, false, 1 or 0"
    assert option.why_not("yes") == "'yes' is not true, false, 1 or 0"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"type": "bool", "max": 1}, "a bool option has no bounds"),
        ({"type": "int", "min": 5, "max": 1}, "min 5 is above max 1"),
        ({"type": "float"}, "type"),
        ({"type": "int", "argv": ["--x"]}, "argv"),  # what an option does never travels
    ],
)
def test_malformed_option_declarations_are_refused(raw: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OptionDeclaration.model_validate(raw)


def test_an_old_agents_repository_entry_means_mlx_lm_without_options() -> None:
    offer = RepositoryOffer.model_validate({"recipes": ["editable"]})
    assert (offer.adapter, offer.options) == ("mlx-lm", {})


def test_requests_refuse_unknown_fields_and_bound_the_long_poll() -> None:
    fingerprint = {"hostname": "box"}
    with pytest.raises(ValidationError, match="wait_s"):
        LeaseRequest.model_validate({"fingerprint": fingerprint, "wait_s": LEASE_WAIT_MAX_S + 1})
    with pytest.raises(ValidationError, match="command"):
        RegisterRequest.model_validate(
            {"name": "box", "fingerprint": fingerprint, "command": "rm -rf /"}
        )
    with pytest.raises(ValidationError, match="status"):
        CompleteRequest.model_validate({"attempt": 1, "status": "done", "manifest": {}})
    assert API_PREFIX == "/api/v1"


def test_progress_carries_a_finite_time_left_and_run_states_read_as_job_states() -> None:
    from coldbench.evidence.contract.protocol import JobState, Progress, RunState

    assert Progress(cells_done=2, cells_total=8, eta_s=185.0).eta_s == 185.0
    for bad in (float("inf"), float("nan"), -1.0):
        with pytest.raises(ValidationError):
            Progress(cells_done=2, cells_total=8, eta_s=bad)
    # Every run state has the word pages show; a leased run is running, like its job.
    assert {state: state.label for state in RunState}[RunState.LEASED] == JobState.RUNNING
    assert RunState.PROCESSED.label == JobState.DONE
    assert len({state.label for state in RunState}) == len(RunState)
