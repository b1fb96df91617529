"""A batch of creates waits for all of its answers from the committer's thread at
once: done when the last is, whatever the order, with failures kept in their futures."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from plait.api.fastpaths import all_done


def test_it_returns_once_every_future_is_done_in_any_order_on_another_thread():
    async def main() -> list[object]:
        futures: list[Future[int]] = [Future() for _ in range(5)]
        futures[1].set_result(1)  # (one done before the wait)

        def answer() -> None:
            for i in (4, 0, 3):
                futures[i].set_result(i)
            futures[2].set_exception(ValueError("refused"))

        waiting = asyncio.ensure_future(all_done(futures))
        await asyncio.sleep(0)
        assert not waiting.done()
        threading.Thread(target=answer).start()
        await asyncio.wait_for(waiting, 10)
        return [f.exception() or f.result() for f in futures]

    got = asyncio.run(main())
    assert got[:2] == [0, 1] and got[3:] == [3, 4]
    assert isinstance(got[2], ValueError)


def test_nothing_to_wait_for_and_all_done_already():
    async def main() -> None:
        await all_done([])
        done: Future[int] = Future()
        done.set_result(7)
        await asyncio.wait_for(all_done([done]), 10)

    asyncio.run(main())


def test_a_wait_given_up_leaves_the_answers_to_come_harmless(caplog):
    async def main() -> Future[int]:
        pending: Future[int] = Future()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(all_done([pending]), 0.01)
        return pending

    pending = asyncio.run(main())
    pending.set_result(1)  # (its loop is closed: nothing is woken, nothing raised)
    assert pending.result() == 1
    assert not [r for r in caplog.records if r.name == "concurrent.futures"]
