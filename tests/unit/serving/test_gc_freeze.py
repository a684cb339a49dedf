"""``calctl serve`` freezes its start-up heap, so generation-2 collections while serving do not walk it."""

from __future__ import annotations

import gc

from calctl.serving.launch import freeze_startup_heap


def test_the_start_up_heap_goes_to_the_permanent_generation_and_garbage_is_collected_first() -> None:
    gc.unfreeze()
    try:
        kept = [object()]  # a live, tracked object start-up made
        cycle: list[object] = []
        cycle.append(cycle)  # garbage in a cycle: collected, not frozen for ever
        del cycle
        before = gc.get_freeze_count()
        freeze_startup_heap()
        assert gc.get_freeze_count() > before
        assert gc.get_count()[2] == 0 and all(o is not kept for o in gc.get_objects(2))
        assert not any(isinstance(o, list) and len(o) == 1 and o[0] is o for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects(2))  # unfrozen: back in the oldest generation
