"""What one rollout's result may weigh in Redis, checked before it is written.

A result is what the agent returned (its messages, which quote the TrainGate's answers), its
trajectory and its turns' token ids. However large the answers were, a record must not hold
hundreds of megabytes for its retention time, nor be posted back whole: a result over the
budget (``ROLLOUT_FLEET_RESULT_MAX_MB``) ends the rollout once as a failure that names the
budget (v2: category ``validation_error``), its LLM counters kept and its turns dropped. One
rule for both generations; docs/OPERATIONS.md sizes the default.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024
SETTING = "ROLLOUT_FLEET_RESULT_MAX_MB"


@dataclass(frozen=True)
class ResultBudget:
    """The bytes one rollout's stored result (its parts together) may take."""

    limit: int

    @classmethod
    def of_mb(cls, megabytes: int) -> ResultBudget:
        return cls(megabytes * MIB)

    def over(self, *parts: str) -> str | None:
        """Why ``parts`` (the texts to be written) are over the budget; ``None`` if not. A text
        is measured in UTF-8 bytes, encoded only if its characters alone could tip it."""
        if sum(map(len, parts)) * 4 <= self.limit:  # even all 4-byte characters fit
            return None
        size = sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)
        if size <= self.limit:
            return None
        return (
            f"the rollout's result is {size / MIB:.1f} MiB, over the {self.limit // MIB} MiB "
            f"a result may take ({SETTING})"
        )


__all__ = ["SETTING", "ResultBudget"]
