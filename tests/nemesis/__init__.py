"""A randomized fault schedule (in the spirit of Jepsen) against two fleets sharing one Redis,
and a checker of the promise: every admitted rollout ends with exactly one result.

``stage`` starts the processes, ``faults`` draws and applies a seeded schedule, ``observe``
watches what the checker needs (every terminal v2 poll, which execution held each rollout),
``checker`` reads every rollout's history and reports each broken invariant by kind, ``run``
ties them together; ``python -m tests.nemesis --seed N`` replays a seed (a failing one prints
that command). ``test_checker`` plants each kind of broken promise and asserts the checker
reports it.

``--sentinel`` runs the same on Redis that fails over: a primary, a replica and three
sentinels, every fleet process given the sentinels' URL, admissions waiting for the replica
(``--admission-replicas``, 1 by default), and ``failover`` among the faults (``faults``).
"""
