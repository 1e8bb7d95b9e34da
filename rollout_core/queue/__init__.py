"""The queue between gateways and workers: one Celery configuration for every process that
touches the broker, the task messages the store's scripts enqueue, and kombu's Redis transport
hardened against broken connections."""
