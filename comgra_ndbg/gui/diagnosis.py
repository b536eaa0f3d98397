"""The Diagnosis tab: a stored diagnosis as ranked hypothesis cards, an events table and coupled failures.

Pure functions in two layers: ``*_rows`` and :func:`chain_lines` turn the analysis dataclasses into plain
strings (the tests compare them exactly), and :func:`diagnosis_view` renders those as Dash components.
Every hypothesis card and every event row is clickable: its id (:func:`ids.diagnosis_jump`) carries the
item (``h0``, ``e3``), node, onset step and kind; the view callback jumps there, selects the statistic the
rule fired on and shows its evidence (:func:`evidence_view`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dash import html

from typing import Any

from comgra_ndbg.analysis.events import CausalChain, CausalLink, Diagnosis, Event, Hypothesis
from comgra_ndbg.gui import ids
from comgra_ndbg.gui.evidence import Focus
from comgra_ndbg.gui.figures import format_number
from comgra_ndbg.gui.state import StoredDiagnosis
from comgra_ndbg.gui.timelines import EvidenceMarks, event_text
from comgra_ndbg.gui.views import graph_of, message, table

__all__ = ["HypothesisRow", "chain_lines", "coupled_rows", "diagnosis_view", "event_label", "event_rows",
           "evidence_rows", "evidence_view", "hypothesis_rows", "percent", "plural", "signature_view", "summary_line"]

MAX_EVENT_ROWS = 100
EVENT_HEADER = ("family", "node", "kind", "from → to", "steps", "magnitude", "strength")
NO_ANALYSIS = "No analysis stored for this trial yet — press Analyze now, or run `comgra_ndbg.analyze(path)`."


@dataclass(frozen=True)
class HypothesisRow:
    """One hypothesis as shown: ``jump`` is the ``(node, step, kind)`` choosing it selects."""

    rank: int
    confidence: float
    percent: str
    sentence: str
    type: str
    origin: str
    node: str
    onset: int
    chain: tuple[str, ...]
    jump: tuple[str, int, str]
    remedy: str = ""


def plural(count: int, singular: str, many: str | None = None) -> str:
    """``count`` things, in the right number.

    >>> plural(1, "hypothesis", "hypotheses"), plural(0, "hypothesis", "hypotheses"), plural(3, "event")
    ('1 hypothesis', '0 hypotheses', '3 events')
    """
    return f"{count} {singular if count == 1 else (many or singular + 's')}"


def percent(confidence: float) -> str:
    """A confidence as a whole percentage.

    >>> percent(0.9543), percent(0.004), percent(1.0)
    ('95%', '0%', '100%')
    """
    return f"{round(100 * confidence)}%"


def event_label(event: Event) -> str:
    """An event in a causal chain: its node, new state, kind and onset.

    >>> event_label(Event("activation_regime", "h", "value", "normal", "saturated", 10, 29, 0.9, 0.7))
    'h saturated (value) at step 10'
    """
    return f"{event.node} {event.to_state} ({event.kind}) at step {event.onset}"


def _link_line(link: CausalLink) -> str:
    return f"{event_label(link.cause)} → {event_label(link.effect)} · {link.via}, {link.lag} steps later"


def chain_lines(chain: CausalChain) -> list[str]:
    """The chain as "event → event" lines, one per causal link; a chain without links is its root alone."""
    return [_link_line(link) for link in chain.links] or [event_label(chain.root)]


def _jump(hypothesis: Hypothesis) -> tuple[str, int, str]:
    root = hypothesis.chain.root
    return hypothesis.node, int(hypothesis.onset), root.kind if root.node == hypothesis.node else ""


def hypothesis_rows(diagnosis: Diagnosis) -> list[HypothesisRow]:
    """The hypotheses best first, ranked from 1."""
    return [HypothesisRow(rank, h.confidence, percent(h.confidence), h.sentence, h.type, h.origin, h.node or "—",
                          h.onset, tuple(chain_lines(h.chain)), _jump(h), h.remedy)
            for rank, h in enumerate(diagnosis.hypotheses, start=1)]


def event_rows(events: Sequence[Event]) -> list[tuple[str, ...]]:
    """One row per event: family, node, kind, from → to, onset–end, magnitude, strength."""
    return [(e.family, e.node, e.kind, f"{e.from_state} → {e.to_state}", f"{e.onset}–{e.end}",
             format_number(e.magnitude), format_number(e.strength)) for e in events]


def coupled_rows(coupled: Sequence[CausalLink]) -> list[tuple[str, ...]]:
    """One row per coupled failure: cause, effect, how it propagated, and the lag in steps."""
    return [(event_label(link.cause), event_label(link.effect), link.via, str(link.lag)) for link in coupled]


def summary_line(stored: StoredDiagnosis) -> str:
    """What the analysis saw and found, in one line."""
    d = stored.diagnosis
    return (f"trial {d.trial}: {plural(d.num_steps, 'step')} analysed (up to step {d.last_step}) · "
            f"{plural(len(d.hypotheses), 'hypothesis', 'hypotheses')} · {plural(len(d.events), 'event')} · "
            f"{plural(len(d.coupled), 'coupled failure')}")


def _current(node: str, selected: str | None, shown: Mapping[str, str]) -> bool:
    return selected is not None and shown.get(node, node) == selected


def evidence_rows(focus: Focus, marks: EvidenceMarks | None) -> list[tuple[str, str]]:
    """``(fact, value)`` rows of what a rule fired on: the series, the onset and end, the baseline, the
    threshold with its name, and the event's magnitude and strength.

    >>> from comgra_ndbg.analysis.events import Evidence
    >>> event = Event("activation_regime", "h", "value", "normal", "saturated", 10, 23, 0.9, 0.7,
    ...               (Evidence("h/value/saturated_fraction", (10, 11), (0.8, 0.9)),))
    >>> marks = EvidenceMarks(10, 23, (10, 11), (0.8, 0.9), float("nan"), 0.5, "saturated_enter")
    >>> evidence_rows(Focus("e0", event), marks)  # doctest: +NORMALIZE_WHITESPACE
    [('event', 'activation_regime: normal → saturated'), ('series', 'h/value/saturated_fraction'),
     ('onset – end', 'step 10 – step 23'), ('baseline', '— (an absolute rule)'),
     ('threshold', 'saturated_enter = 0.5'), ('magnitude · strength', '0.9 · 0.7')]
    """
    event, evidence = focus.event, focus.evidence
    rows = [("event", f"{event.family}: {event.from_state} → {event.to_state}")]
    if evidence is not None:
        rows.append(("series", evidence.series))
    rows.append(("onset – end", f"step {event.onset} – step {event.end}"))
    if marks is not None:
        baseline = marks.baseline
        rows.append(("baseline", format_number(baseline) if baseline == baseline else "— (an absolute rule)"))
        rows.append(("threshold", f"{marks.threshold_name} = {format_number(marks.threshold)}"
                      if marks.threshold is not None else "— (not named by the analysis' thresholds)"))
    rows.append(("magnitude · strength", f"{format_number(event.magnitude)} · {format_number(event.strength)}"))
    return rows


def evidence_view(focus: Focus | None, marks: EvidenceMarks | None, figure: dict[str, Any] | None) -> Any:
    """The evidence of the chosen hypothesis or event: its sentence and remedy, the facts, and the plot of
    the series the rule fired on with onset, baseline and threshold drawn; empty when nothing is chosen."""
    if focus is None:
        return []
    hypothesis = focus.hypothesis
    heading = hypothesis.sentence if hypothesis is not None else event_text(focus.event)
    parts: list[Any] = [html.Div(f"Evidence · {heading}", className="tensor-header")]
    if hypothesis is not None and hypothesis.remedy:
        parts.append(html.Div(f"Remedy: {hypothesis.remedy}", className="remedy"))
    parts.append(table(("fact", "value"), evidence_rows(focus, marks), table_id=ids.EVIDENCE + "-table"))
    if figure is not None:
        parts.append(graph_of(figure, ids.EVIDENCE + "-plot", height=260))
    return html.Div(parts, className="evidence")


def _hypothesis_card(row: HypothesisRow, current: bool) -> html.Div:
    node, step, kind = row.jump
    return html.Div([
        html.Div([
            html.Span(f"#{row.rank}", className="rank"),
            html.Span(html.Span(style={"width": row.percent}), className="bar",
                      title=f"confidence {row.confidence:.3f}"),
            html.Span(row.percent, className="percent"),
            html.Span(row.sentence, className="sentence"),
        ], className="hypothesis-head"),
        html.Div(f"{row.type} · origin {row.origin} · node {row.node} · onset step {row.onset}", className="facts"),
        *([html.Div(f"Remedy: {row.remedy}", className="remedy")] if row.remedy else []),
        html.Div([html.Div(line, className="chain-line") for line in row.chain], className="chain"),
    ], id=ids.diagnosis_jump(f"h{row.rank - 1}", node, step, kind), n_clicks=0,
        className="hypothesis current" if current else "hypothesis", title="select its node and onset step")


def _events_table(events: Sequence[Event], selected: str | None, shown: Mapping[str, str]) -> html.Table:
    rows = []
    for index, (event, cells) in enumerate(zip(events, event_rows(events))):
        rows.append(html.Tr([html.Td(cell) for cell in cells], id=ids.diagnosis_jump(
            f"e{index}", event.node, int(event.onset), event.kind), n_clicks=0, title=event_text(event),
            className="event-row current" if _current(event.node, selected, shown) else "event-row"))
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in EVENT_HEADER])), html.Tbody(rows)],
                      id=ids.DIAGNOSIS + "-events", className="data-table events")


def signature_view(uri: str) -> list[Any]:
    """The failure signature (a ``data:image/png`` address from :func:`comgra_ndbg.signature.data_uri`)
    under its heading."""
    return [html.H4("Failure signature"),
            html.Img(src=uri, id=ids.SIGNATURE, className="signature", style={"maxWidth": "100%"},
                     alt="gradient and activation norms of every layer in the steps up to the failure, with the "
                         "onset step and the origin layer marked")]


def diagnosis_view(stored: StoredDiagnosis | None, *, selected: str | None = None,
                   shown: Mapping[str, str] | None = None, focus: str = "", signature: str | None = None) -> html.Div:
    """The Diagnosis tab for a stored diagnosis (None: none stored yet): a stale warning when the recording
    has grown since, the hypotheses (or the healthy-run message), the failure ``signature`` image when one
    is given, the events and the coupled failures. Rows of the ``selected`` displayed node (``shown`` maps
    recorded nodes to displayed ones) are highlighted."""
    if stored is None:
        return html.Div([message(NO_ANALYSIS)])
    shown = shown or {}
    d = stored.diagnosis
    parts = [html.Div(summary_line(stored), className="tensor-header")]
    if stored.stale:
        parts.append(html.Div(f"Stale: this analysis saw {d.num_steps} steps, the recording now holds "
                              f"{stored.num_steps} — press Analyze now to include the new steps.",
                              className="message warning"))
    rows = hypothesis_rows(d)
    parts.append(html.H4(f"Hypotheses ({len(rows)})"))
    if rows:
        parts.append(html.Div([_hypothesis_card(row, focus == f"h{row.rank - 1}" or (
            not focus and _current(row.jump[0], selected, shown))) for row in rows], id=ids.DIAGNOSIS + "-hypotheses"))
    else:
        parts.append(html.Div("Healthy run: no failure hypothesis.", className="message healthy"))
    if signature:
        parts.extend(signature_view(signature))
    shown_events = d.events[:MAX_EVENT_ROWS]
    parts.append(html.H4(f"Events ({len(d.events)})"))
    parts.append(_events_table(shown_events, selected, shown) if shown_events else message("none"))
    if len(d.events) > MAX_EVENT_ROWS:
        parts.append(message(f"… and {len(d.events) - MAX_EVENT_ROWS} more events, not shown."))
    if d.coupled:
        parts.append(html.H4(f"Coupled failures ({len(d.coupled)})"))
        parts.append(table(("cause", "effect", "via", "lag (steps)"), coupled_rows(d.coupled),
                           table_id=ids.DIAGNOSIS + "-coupled"))
    return html.Div(parts)
