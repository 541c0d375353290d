"""Upstream packages as oracles: drafters built, saved and run by z-lab `dflash` 0.1.0, vLLM `speculators` 0.9.0 and
SpecForge 0.2.0 themselves, in their own venvs (worker.py), compared with what every backend drafts from
their `portable-spec import` (checks.py); cases.py lists what is built."""
