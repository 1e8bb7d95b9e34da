"""Evaluating an agent on a dataset (``rollout-sdk eval run``, ``rollout-fleet eval run``).

An evaluation is a set of work items, every selected dataset row times ``n`` samples (and
again for a baseline model, when one is given). Each item runs as one rollout, through an
executor: in this process (:mod:`.local`), or through a fleet's gateway (the fleet's own
executor). The LLM side is a local bridge to any OpenAI-compatible endpoint. Results are kept
under the run's directory as they come, so an interrupted run resumes where it stopped.

* :mod:`.config`  the eval TOML (upstream's sections, plus ``[model]`` and ``[fleet]``);
* :mod:`.scoring` v1-era eval functions, in either signature style;
* :mod:`.results` work items, their results and the run directory;
* :mod:`.metrics` mean reward, pass rate, pass@k, failures, latency and tokens;
* :mod:`.report`  the self-contained HTML report;
* :mod:`.run`     the run itself: plan, execute, keep, summarise.
"""
