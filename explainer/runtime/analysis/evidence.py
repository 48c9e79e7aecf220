"""A runtime finding from what an explanation established: the cause's code and variant, the
evidence (carrier, calls, facts), the culprits and the fixes. The catalog writes the sentences,
the culprits' roles included."""
from __future__ import annotations

from dataclasses import replace

from ...causes import BY_CODE, role_of
from ...fixes.soundness import runs
from ...model import CallSite, Culprit, Evidence, Fact, Finding, Location
from ...reading import source as src
from ..records import BackwardCall
from .context import Context
from .locate import Candidate, Located


def made_at(ctx: Context, located: Located | None) -> CallSite | None:
    return ctx.call_site(located.source.filename, located.row) if located is not None else None


def culprit(ctx: Context, candidate: Candidate) -> Culprit:
    """The candidate where it was made (or where its frame stands); its role comes later."""
    located = candidate.located
    if located is None:
        frame = ctx.frames[candidate.binding.frame_index]
        return Culprit(candidate.name, frame.f_code.co_filename, Location(frame.f_lineno, 1), "")
    return culprit_at(candidate.name, located.source, located.location)


def culprit_at(name: str, source: src.Source, location: Location) -> Culprit:
    return Culprit(name, source.filename, location, "", source.line(location.row).strip())


def finding(code: str, variant: str, kind: str, evidence: Evidence, culprits=(), fixes=(),
            confidence: str = "certain") -> Finding:
    """The runtime finding; `fixes` best first (None entries, builders that did not apply, and
    fixes that could not run are dropped). It points at the first culprit's name, else at the
    failing call."""
    culprits = tuple(replace(c, role=role_of(code, variant, i, evidence)) for i, c in enumerate(culprits))
    fixes = tuple(f for f in fixes if f is not None and runs(f))
    if culprits:
        filename, start, end = _span(culprits[0].filename, culprits[0].location, culprits[0].name)
    else:
        site = evidence.backward
        filename, start, end = _span(site.filename, Location(site.row, 1), "") if site else ("", Location(1, 1),
                                                                                              Location(1, 1))
    return Finding(code, variant, filename, start, end, evidence, fixes, culprits, kind,
                   BY_CODE[code].severity, confidence, "runtime")


def _span(filename: str, start: Location, name: str) -> tuple[str, Location, Location]:
    """`name` at `start`, or the rest of the line when the line there does not read `name`."""
    source = src.load(filename)
    line = source.line(start.row) if source is not None else ""
    if name and line[start.column - 1:start.column - 1 + len(name)] == name:
        return filename, start, Location(start.row, start.column + len(name))
    return filename, start, Location(start.row, max(len(line) + 1, start.column + 1))


def freed_graph(ctx: Context, carrier: str, located: Located | None, previous: BackwardCall, advice: str,
                **facts: Fact) -> Evidence:
    """The evidence of a backward through a freed graph: the carrier and where it was made, the
    failing call, the earlier call that freed the graph, and the steps between the two."""
    between = ctx.steps_between(previous.tick, ctx.call.tick) if ctx.call is not None else []
    return Evidence(carrier, made_at(ctx, located), ctx.backward_site(), ctx.call_site(previous.filename, previous.row, previous.column),
                    tuple(ctx.call_site(s.filename, s.row, s.column) for s in between), advice, tuple(facts.items()))
