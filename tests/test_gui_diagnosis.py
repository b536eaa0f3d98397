"""The Diagnosis tab's pure view functions on a hand-made diagnosis: exact rows, chain lines and components."""
from __future__ import annotations

from typing import Any

from dash import html

from comgra_ndbg.analysis.events import CausalChain, CausalLink, Diagnosis, Event, Hypothesis
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.diagnosis import (HypothesisRow, chain_lines, coupled_rows, diagnosis_view, event_rows,
                                       hypothesis_rows, summary_line)
from comgra_ndbg.gui.timelines import event_text
from comgra_ndbg.gui.state import StoredDiagnosis

SATURATED = Event("activation_regime", "hidden1", "value", "normal", "saturated", 10, 23, 0.890625, 0.6953125)
VANISHING = Event("gradient_health", "hidden0", "grad", "healthy", "vanishing", 12, 23, -2.25, 1.0)
UNSTABLE = Event("optimizer_stability", "optimizer", "update", "stable", "unstable", 3, 5, 1.5, 0.5)
LINK = CausalLink(SATURATED, VANISHING, 2, "backward")
FIRST = Hypothesis("saturation", "node", "hidden1", 10, 0.9543, "Saturation originated in 'hidden1' at step 10.",
                   CausalChain(SATURATED, (LINK,)), remedy="normalise the input of 'hidden1'")
SECOND = Hypothesis("optimizer_instability", "optimizer", "", 3, 0.31, "The optimizer was unstable at step 3.",
                    CausalChain(UNSTABLE))
DIAGNOSIS = Diagnosis("fault", 24, 23, (UNSTABLE, SATURATED, VANISHING), (LINK,), (FIRST, SECOND))
HEALTHY = Diagnosis("ok", 6, 5, (), (), ())


def texts(component: Any) -> list[str]:
    """Every string in a component tree, depth first."""
    if isinstance(component, str):
        return [component]
    children = getattr(component, "children", None)
    if children is None:
        return []
    return [t for child in (children if isinstance(children, list) else [children]) for t in texts(child)]


def find(component: Any, class_name: str) -> list[Any]:
    """Every component of the tree whose className contains ``class_name``."""
    found = [component] if class_name in (getattr(component, "className", None) or "").split() else []
    children = getattr(component, "children", None)
    for child in (children if isinstance(children, list) else [children] if children is not None else []):
        found += find(child, class_name)
    return found


def test_hypotheses_are_ranked_rows_with_percentages_and_chains() -> None:
    assert hypothesis_rows(DIAGNOSIS) == [
        HypothesisRow(1, 0.9543, "95%", "Saturation originated in 'hidden1' at step 10.", "saturation", "node",
                      "hidden1", 10, ("hidden1 saturated (value) at step 10 → hidden0 vanishing (grad) at step 12 · "
                                      "backward, 2 steps later",), ("hidden1", 10, "value"),
                      "normalise the input of 'hidden1'"),
        HypothesisRow(2, 0.31, "31%", "The optimizer was unstable at step 3.", "optimizer_instability", "optimizer",
                      "—", 3, ("optimizer unstable (update) at step 3",), ("", 3, "")),
    ]
    assert chain_lines(CausalChain(SATURATED)) == ["hidden1 saturated (value) at step 10"]


def test_events_and_coupled_failures_as_rows() -> None:
    assert event_rows(DIAGNOSIS.events) == [
        ("optimizer_stability", "optimizer", "update", "stable → unstable", "3–5", "1.5", "0.5"),
        ("activation_regime", "hidden1", "value", "normal → saturated", "10–23", "0.890625", "0.695312"),
        ("gradient_health", "hidden0", "grad", "healthy → vanishing", "12–23", "-2.25", "1"),
    ]
    assert coupled_rows(DIAGNOSIS.coupled) == [
        ("hidden1 saturated (value) at step 10", "hidden0 vanishing (grad) at step 12", "backward", "2")]
    assert summary_line(StoredDiagnosis(DIAGNOSIS, False, 24)) == (
        "trial fault: 24 steps analysed (up to step 23) · 2 hypotheses · 3 events · 1 coupled failure")


def test_the_view_has_clickable_cards_and_rows_that_jump_to_node_step_and_kind() -> None:
    view = diagnosis_view(StoredDiagnosis(DIAGNOSIS, False, 24), selected="hidden1")
    cards = find(view, "hypothesis")
    assert [card.id for card in cards] == [ids.diagnosis_jump("h0", "hidden1", 10, "value"),
                                           ids.diagnosis_jump("h1", "", 3, "")]
    assert [card.className for card in cards] == ["hypothesis current", "hypothesis"]
    first = texts(cards[0])
    assert first[:4] == ["#1", "95%", "Saturation originated in 'hidden1' at step 10.",
                         "saturation · origin node · node hidden1 · onset step 10"]
    assert find(cards[0], "bar")[0].children.style == {"width": "95%"}
    assert first[4] == "Remedy: normalise the input of 'hidden1'"
    assert first[5] == ("hidden1 saturated (value) at step 10 → hidden0 vanishing (grad) at step 12 · backward, "
                        "2 steps later")
    assert not find(cards[1], "remedy")  # a hypothesis without a remedy shows none
    rows = find(view, "event-row")
    assert [row.id for row in rows] == [ids.diagnosis_jump("e0", "optimizer", 3, "update"),
                                        ids.diagnosis_jump("e1", "hidden1", 10, "value"),
                                        ids.diagnosis_jump("e2", "hidden0", 12, "grad")]
    assert [row.className for row in rows] == ["event-row", "event-row current", "event-row"]
    assert rows[1].title == event_text(SATURATED) and texts(rows[1])[3] == "normal → saturated"
    headings = [c.children for c in view.children if isinstance(c, html.H4)]
    assert headings == ["Hypotheses (2)", "Events (3)", "Coupled failures (1)"]
    assert not find(view, "warning")


def test_collapsed_nodes_highlight_the_rows_of_their_members() -> None:
    view = diagnosis_view(StoredDiagnosis(DIAGNOSIS, False, 24), selected="hidden",
                          shown={"hidden1": "hidden", "hidden0": "hidden"})
    assert [row.className for row in find(view, "event-row")] == ["event-row", "event-row current",
                                                                  "event-row current"]


def test_healthy_stale_and_missing_analyses_say_so() -> None:
    healthy = diagnosis_view(StoredDiagnosis(HEALTHY, False, 6))
    assert "Healthy run: no failure hypothesis." in texts(healthy) and not find(healthy, "hypothesis")
    assert find(healthy, "healthy")[0].children == "Healthy run: no failure hypothesis."
    stale = diagnosis_view(StoredDiagnosis(DIAGNOSIS, True, 30))
    assert find(stale, "warning")[0].children == ("Stale: this analysis saw 24 steps, the recording now holds 30 — "
                                                  "press Analyze now to include the new steps.")
    assert texts(diagnosis_view(None)) == [
        "No analysis stored for this trial yet — press Analyze now, or run `comgra_ndbg.analyze(path)`."]


def test_long_event_lists_are_cut_with_a_count() -> None:
    many = tuple(Event("activation_regime", f"n{i}", "value", "normal", "dead", i, i, 0.5, 0.5) for i in range(103))
    view = diagnosis_view(StoredDiagnosis(Diagnosis("t", 200, 199, many, (), ()), False, 200))
    assert len(find(view, "event-row")) == 100
    assert "… and 3 more events, not shown." in texts(view)
