"""Cancel and revoke: every way a rollout is stopped, and what its trainer hears."""
