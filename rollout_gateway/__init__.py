"""The gateway: a stateless FastAPI front that admits rollouts into Redis and answers status,
result and cancel calls (``app.py`` builds it). It reaches Redis only through
``rollout_core``'s store and never imports the worker."""
