"""Running an agent on dataset rows in this process (``rollout-sdk test``): a dataset reader,
a local TrainGate that forwards to any OpenAI-compatible endpoint, the row runner, the
interactive step-through and the report. Needs ``rollout-sdk[server,cli]``."""
