"""agent-eval's prompts state no case's solution: every case's prompt is rendered exactly as the
drafting loop sends it (system + task, caught at the client) and searched for the distinctive
code of the case's reference answer."""

from __future__ import annotations

import pytest

from hfadapt.agent.client import AgentClient, AgentSettings, Completion
from hfadapt.agent.context import system_prompt
from hfadapt.agent.evaluate import PromptWatch
from hfadapt.agent.loop import draft_adapter
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.suite import PENDING, SUITE, SuiteCase, get, solution_in, suite_case


class _NoCode(AgentClient):
    """Answers without code: the session ends after the first request, nothing is run."""

    def __init__(self) -> None:
        self.settings = AgentSettings(model="no-code", max_attempts=1)

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        return Completion("I would rather not.", 10, 5, 0.0, "no-code")


def _prompt_as_sent(spec: SuiteCase) -> tuple[str, dict[str, object]]:
    case = suite_case(spec)
    watch = PromptWatch(_NoCode())
    outcome = draft_adapter(case, watch, DraftOptions(accept=False), taken_names={})
    assert watch.first is not None, (spec.name, outcome.outcome, outcome.reason)
    assert [m["role"] for m in watch.first] == ["system", "user"], watch.first
    return watch.prompt_text(), case.evidence


@pytest.mark.parametrize("spec", SUITE + PENDING, ids=lambda s: s.name)
def test_every_reference_is_recognised_by_its_own_patterns(spec: SuiteCase) -> None:
    """The check could fail: each case's patterns find its reference answer."""
    assert spec.distinctive, spec.name
    for pattern in spec.distinctive:
        one = SuiteCase(**{**spec.__dict__, "distinctive": (pattern,)})
        assert solution_in(one, spec.reference), f"{spec.name}: {pattern!r} misses its reference"
    assert "@adapter(" in spec.reference and spec.target in spec.reference, spec.reference


@pytest.mark.parametrize("spec", SUITE, ids=lambda s: s.name)
def test_no_prompt_states_its_solution(spec: SuiteCase) -> None:
    text, evidence = _prompt_as_sent(spec)
    shown = solution_in(spec, text)
    assert shown is None, f"{spec.name}: the prompt as sent states the solution: ...{shown}..."
    # nothing of the case's own words reaches the agent: not its description, not its name
    assert spec.description not in text and f'"{spec.name}"' not in text, evidence
    assert spec.target in text  # the prompt still says what to replace


def test_a_prompt_that_shows_the_solution_is_caught() -> None:
    """gelu_new's solution is one of the system prompt's examples: rendered for another case the
    check names the snippet; for gelu_new's own case the example is left out. An evidence
    carrying the reference is caught too."""
    gelu = get("gelu-new-cube")
    assert gelu in SUITE
    shown = solution_in(gelu, system_prompt())
    assert shown is not None and "0.044715*(input*input*input)" in shown, shown
    assert solution_in(gelu, system_prompt(target=gelu.target)) is None
    rms = get("rms-norm-fp32-pow")
    assert solution_in(rms, system_prompt()) is not None
    assert solution_in(rms, system_prompt(target=rms.target)) is None
    softsign = get("softsign-pow-reciprocal")
    leaked = f"Evidence: {{'hint': {softsign.reference!r}}}".replace("\\n", "\n")
    assert solution_in(softsign, leaked) is not None
    assert solution_in(softsign, "Evidence: x * torch.pow(1.0 + x.abs(), -1.0)") is None
