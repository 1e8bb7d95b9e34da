"""rewards.py of the quick-start layout. The snippet calls ``compute_reward(...)`` with a
literal ``...`` placeholder; a placeholder yields no reward (the trainer then scores)."""


def compute_reward(solution=..., ground_truth=None):
    if solution is ... or ground_truth is None:
        return None
    return 1.0 if ground_truth in str(solution) else 0.0
