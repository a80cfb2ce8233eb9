"""The scheduler follows the bindings registry (real Kafka) and reads it again on demand."""

from __future__ import annotations

from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Source
from asynctier.platform.config import Settings
from asynctier.platform.registry import BindingRegistry
from tests.scheduler_harness import item, items, running_scheduler


def test_bindings_come_from_the_registry_and_new_ones_are_found(settings: Settings) -> None:
    registry = BindingRegistry(settings)
    registry.put(Binding("early", Source("kafka", "some-topic"), "tests.funcs.basic:noop"))
    with running_scheduler(settings, None) as running:
        assert all(o["status"] == "ok" for o in running.submit(items("early", 50)).values())
        registry.put(Binding("late", Source("kafka", "some-topic"), "tests.funcs.basic:noop"))
        # submitted right away: the scheduler reads the registry again when it meets
        # a binding it does not know yet
        outcomes = running.submit([item("late", 1), item("ghost", 2)])
        assert outcomes[1]["status"] == "ok"
        ghost = outcomes[2]
        assert ghost["status"] == "retry" and ghost["spends_attempt"] is False
        assert ghost["after_s"] == 5.0 and "unknown binding 'ghost'" in (ghost["error"] or "")
        registry.delete("early")
        from tests.helpers import wait_until

        wait_until(lambda: running.submit([item("early", 3)])[3]["status"] == "retry", 15,
                   "a deleted binding is no longer run")


def test_the_delay_process_looks_up_a_binding_it_was_not_told_of_yet(
        settings: Settings) -> None:
    """A record of a binding the follower has not reported yet must not become a dead
    letter because another name was looked up a moment before: each name is looked up in
    the registry on its own (and a name the registry lacks is not asked for again at once).
    """
    from asynctier.delay_streams.bookkeeping import BindingBook

    book = BindingBook(settings, reload_every_s=60.0)
    registry = BindingRegistry(settings)
    assert book.get("gone") is None  # the registry read: no such binding
    registry.put(Binding("late", Source("kafka", "late-topic"), "tests.funcs.basic:noop"))
    assert book.get("late") == Binding("late", Source("kafka", "late-topic"),
                                       "tests.funcs.basic:noop")
    reads: list[int] = []
    real = book.registry.load
    book.registry.load = lambda *a: reads.append(1) or real(*a)  # type: ignore[method-assign]
    assert book.get("gone") is None and reads == []  # asked a moment ago: not again
