"""Renderers of Findings: plain text (the exception note), rich terminal text, Jupyter HTML,
and JSON (explainer run --json)."""
