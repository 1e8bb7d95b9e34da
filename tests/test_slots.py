"""A worker's slots (``rollout_worker/slots.py``): a rollout that must run alone waits for the
others to end, the intake takes nothing meanwhile, and two such rollouts never wait for each
other."""

from __future__ import annotations

import asyncio

import pytest

from rollout_worker.slots import Slots

pytestmark = pytest.mark.anyio


async def test_rollouts_waiting_to_run_alone_take_turns_after_the_others_end() -> None:
    slots = Slots(4)
    running: set[str] = set()
    seen_alone: dict[str, set[str]] = {}
    order: list[str] = []

    async def rollout(name: str, seconds: float, *, alone: bool = False) -> None:
        await slots.take()
        try:
            if alone:
                async with slots.alone():
                    seen_alone[name] = set(running)
                    running.add(name)
                    order.append(name)
                    await asyncio.sleep(seconds)
                    running.discard(name)
            else:
                running.add(name)
                order.append(name)
                await asyncio.sleep(seconds)
                running.discard(name)
        finally:
            slots.free()

    tasks = [asyncio.create_task(rollout(f"n{i}", 0.2)) for i in range(2)]
    await asyncio.sleep(0.01)
    tasks += [asyncio.create_task(rollout(f"s{i}", 0.05, alone=True)) for i in range(2)]
    await asyncio.sleep(0.01)
    late = asyncio.create_task(rollout("late", 0.01))  # the intake's next take
    await asyncio.sleep(0.01)
    assert slots.locked()  # nothing starts while one waits to run alone
    assert "late" not in order
    async with asyncio.timeout(5):  # two waiting to run alone never deadlock
        await asyncio.gather(*tasks, late)
    assert seen_alone == {"s0": set(), "s1": set()}
    assert order[:2] == ["n0", "n1"]
    assert set(order[2:4]) == {"s0", "s1"}
    assert order[4] == "late"
    assert not slots.locked()


async def test_a_rollout_cancelled_while_it_waits_to_run_alone_holds_its_slot_again() -> None:
    """However the wait ends, the caller holds one slot again: the intake frees it when the
    rollout's task ends, and the count must come out even."""
    slots = Slots(2)
    await slots.take()  # a rollout running normally

    async def suspect() -> None:
        await slots.take()
        try:
            async with slots.alone():
                raise AssertionError("ran beside another rollout")
        finally:
            slots.free()

    waiting = asyncio.create_task(suspect())
    await asyncio.sleep(0.01)
    assert slots.locked()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    slots.free()
    assert not slots.locked()
    async with asyncio.timeout(1):  # both slots are free again
        await slots.take()
        await slots.take()
    assert slots.locked()
